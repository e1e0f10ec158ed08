#!/usr/bin/env bash
# Issue 17, session 26 (not yet run): why NormFoldedDecodeMatchesCpu and L2PrefetchChangesNoResult
# failed on the H200 (docs/CUDA.md, "Session 26"). Runs Bf16ModelOneRowDecodeMatchesCpu (a bf16 GGUF
# model and an fp32 copy, every prefill row and decode step against the CPU, three GPU runs
# each) as built and under PTLLM_CUDA_PDL=0 / PTLLM_CUDA_GEMV1=0 / PTLLM_CUDA_FUSE=0, the two
# failing tests with and without PDL, then compute-sanitizer initcheck and memcheck on the
# first. Staged as cuda_fold_device.sh is (prebuilt/ with cuda_backend_test built for the lite
# shared folder, shared-lite/, cuda_device_env.sh beside it): cd build-stage && bash THIS.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. "$(dirname "$0")/cuda_device_env.sh"
device_preamble
T=$B/cuda_backend_test
for e in "X=1" PTLLM_CUDA_PDL=0 PTLLM_CUDA_GEMV1=0 PTLLM_CUDA_FUSE=0; do
  echo "== diag [$e]"; env $e timeout 60 $T --gtest_filter='*Bf16ModelOneRow*' 2>&1 | grep -E 'weights, run|rror|OK|FAILED' | cut -c1-400
done
for e in "X=1" PTLLM_CUDA_PDL=0; do
  echo "== fold/prefetch tests [$e]"; env $e timeout 60 $T --gtest_filter='*NormFolded*:*L2Prefetch*' 2>&1 | grep -E '^\[  |folded vs|Which|^step|prefetch . MB' | cut -c1-300
done
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
echo "compute-sanitizer: ${CS:-none}"
if [ -n "$CS" ]; then
  for tool in initcheck memcheck; do
    echo "== $tool"
    timeout 40 $CS --tool $tool --print-limit 8 $T --gtest_filter='*Bf16ModelOneRow*' > "$OUT/cs_$tool.txt" 2>&1
    echo "rc $?"; grep -E '=========' "$OUT/cs_$tool.txt" | head -30 | cut -c1-300
  done
fi
