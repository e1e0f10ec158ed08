#!/usr/bin/env bash
# Builds (if needed) and runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# Parallel tests on few cores: OpenMP workers sleep rather than spin.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -f "$BUILD_DIR/build.ninja" ] || ./scripts/setup.sh
# The side-by-side references some tests run (llama.cpp via node-llama-cpp,
# @huggingface/jinja, the openai client) are pinned in tools/anchors.
./scripts/setup_anchors.sh
cmake --build "$BUILD_DIR" -j "$(nproc)"

# The GPU tests (label `cuda`, built whenever nvcc is found) need a CUDA GPU; a
# machine with nvcc and no GPU (CI) leaves them to the device machine
# (scripts/cuda_device.sh), and says so. A caller's -LE is kept: the two are
# merged into one regular expression, since ctest takes one.
args=("$@")
if [ -f "$BUILD_DIR/tests/cuda/cuda_backend_test" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test.sh: no CUDA GPU here (nvidia-smi -L finds none): the tests labelled 'cuda' are not run" \
       "(they run on the device machine: scripts/cuda_device.sh)"
  merged=() found=0 i=0
  while [ $i -lt ${#args[@]} ]; do
    a=${args[$i]}
    if { [ "$a" = -LE ] || [ "$a" = --label-exclude ]; } && [ $((i + 1)) -lt ${#args[@]} ]; then
      merged+=(-LE "(${args[$((i + 1))]})|^cuda\$"); found=1; i=$((i + 2)); continue
    fi
    merged+=("$a"); i=$((i + 1))
  done
  [ $found = 1 ] || merged+=(-LE '^cuda$')
  args=("${merged[@]}")
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "${args[@]}"
