#!/usr/bin/env bash
# arm64 on an x86-64 Debian machine: installs the cross compiler, qemu-user
# and the arm64 multiarch -dev packages, cross-builds Release in build-arm64
# (cmake/aarch64-linux-gnu.cmake) and runs the fast suite (ctest -LE slow)
# under qemu (CMAKE_CROSSCOMPILING_EMULATOR), printing ctest's summary.
# Extra arguments go to ctest (e.g. -R ops_test). JOBS=N sets build and
# ctest parallelism (default: nproc). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

# The arm64 twins of scripts/setup.sh's libraries. Header-only ones are
# architecture-independent; OpenMP is the cross g++'s libgomp, whose runtime twin
# libgomp1:arm64 the emulated tests load from /usr/lib/aarch64-linux-gnu (libomp-dev:arm64
# cannot be installed beside the amd64 one: both own libomp-14.so.5).
PKGS=(g++-aarch64-linux-gnu qemu-user-static cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev
      libfmt-dev:arm64 libpcre2-dev:arm64 libicu-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64
      libcpp-httplib-dev:arm64 libgomp1:arm64)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  # Debian's own sources serve arm64 unless they restrict Architectures:
  # (deb822) or [arch=...] (one-line format): say which file to change.
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && grep -q 'debian\.org' "$f" || continue
    if grep -qE '^Architectures:|\[arch=' "$f" && ! grep -qE '(Architectures:|arch=).*arm64' "$f"; then
      echo "test_arm64.sh: $f restricts architectures: add arm64 there for the :arm64 packages" >&2
    fi
  done
  $SUDO dpkg --add-architecture arm64
fi
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi
# The host-side references some fast tests run (Node: @huggingface/jinja, the
# openai client), as scripts/test.sh installs them; a no-op when present.
./scripts/setup_anchors.sh
t1=$(date +%s)

BUILD_DIR=${BUILD_DIR:-build-arm64}
JOBS=${JOBS:-$(nproc)}
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
      -DPTLLM_BUILD_BENCH=OFF "${LAUNCHER[@]}" ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
t2=$(date +%s)

# The emulated CPU: qemu's "max" model (dotprod, i8mm, bf16 ...), so every
# NEON level runs; tests print the levels they compared.
# Parallel tests on few cores: OpenMP workers sleep rather than spin (as test.sh).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
rc=0
ctest --test-dir "$BUILD_DIR" -LE slow -j "$JOBS" --output-on-failure "$@" || rc=$?
t3=$(date +%s)
echo "test_arm64.sh: packages $((t1 - t0)) s, cross build $((t2 - t1)) s, tests under qemu $((t3 - t2)) s, total $((t3 - t0)) s"
exit $rc
