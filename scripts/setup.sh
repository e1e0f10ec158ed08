#!/usr/bin/env bash
# Installs the Debian packages the build needs, then configures and builds
# posttrainllm in Release (build/). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev
      libgtest-dev libgmock-dev libbenchmark-dev libomp-dev libicu-dev python3-jinja2)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
