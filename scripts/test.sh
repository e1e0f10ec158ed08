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
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
