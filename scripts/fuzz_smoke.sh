#!/usr/bin/env bash
# CI fuzz smoke: every libFuzzer target for FUZZ_SMOKE_SECONDS (default 30)
# seconds. Installs clang + the libFuzzer runtime (clang, libclang-rt-14-dev,
# libomp-dev) with apt-get when they are missing. Exits non-zero on any
# finding (crash, sanitizer report, leak, timeout, OOM) and prints the
# reproducer, which replays with: build-fuzz/tests/fuzz/<target> <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SMOKE_SECONDS:-30}

have_libfuzzer() {
  local cxx
  cxx=$(command -v clang++ || command -v clang++-14 || true)
  [ -n "$cxx" ] || return 1
  local d
  d=$(mktemp -d)
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$d/t.cc"
  # OpenMP too: the libraries link it, and clang needs libomp for -fopenmp.
  printf '#include <omp.h>\nint f() { return omp_get_max_threads(); }\n' >"$d/o.cc"
  "$cxx" -fsanitize=fuzzer,address,undefined "$d/t.cc" -o "$d/t" >/dev/null 2>&1 &&
    "$cxx" -fopenmp -c "$d/o.cc" -o "$d/o.o" >/dev/null 2>&1
  local rc=$?
  rm -rf "$d"
  return $rc
}

if ! have_libfuzzer; then
  echo "fuzz_smoke: installing clang and the libFuzzer runtime"
  SUDO=
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev libomp-dev >/dev/null
  have_libfuzzer || { echo "fuzz_smoke: clang cannot build a libFuzzer target after install" >&2; exit 2; }
fi

exec scripts/fuzz.sh all "$SECS"
