#!/usr/bin/env bash
# Issue 17, session 27: after the weight upload moved onto the engine's stream (a pageable
# cudaMemcpy on the legacy stream returned before its DMA ended, and the bf16/f16 conversion
# on the non-blocking stream read the half-written staging buffer: docs/CUDA.md, "Session 27").
# Runs the bf16 diagnosis (Bf16ModelWeightTypeDiagnosis: weights as bf16 and as fp32, each GPU
# run against the CPU and against the run before it, 1 and 12 prompt rows) with the tests
# that had failed, then all of cuda_backend_test, then stories260K's perplexity with bf16
# device weights in two processes per setting, then the CPU (--weights bf16) against the GPU
# per cache mode. Staged as the other device scripts are (prebuilt/, shared-lite/,
# cuda_device_env.sh beside it): cd build-stage && bash THIS.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. ./cuda_device_env.sh
device_preamble
T=$B/cuda_backend_test
timeout 90 $T --gtest_filter='*Bf16ModelWeightTypeDiagnosis*:*Bf16ModelOneRow*:*NormFolded*:*L2Prefetch*' 2>&1 |
  grep -E '^diag|weights, run|folded vs|^\[  (  OK|FAILED|PASSED)' | cut -c1-200 | head -60
echo "== all tests"
timeout 240 $T > "$OUT/all.txt" 2>&1; echo "rc $?"
grep -E '^\[  (FAILED|PASSED)|tests ran' "$OUT/all.txt" | head -20
ppl() {  # device flags...; prints the through-cache perplexity
  $B/posttrainllm perplexity shared-lite/models/stories260K shared-lite/text.txt -w 256 -k 4 --cache-only -q --json "$@" 2>&1 |
    tr -d '\n' | python3 -c "import json,sys; print(repr(json.load(sys.stdin)['results'][0]['through_cache']['ppl']))" 2>&1 | tail -1
}
echo "== perplexity stories260K, --device-weights bf16, two processes each"
for i in 1 2; do for f in 0 1; do
  echo "fold $f run $i: $(env PTLLM_CUDA_NORM_FOLD=$f ppl --device cuda --device-weights bf16)"
done; done
echo "== CPU (--weights bf16) against GPU (--device-weights bf16)"
for q in fp16 int4 int2; do
  for d in "--device cpu --weights bf16" "--device cuda --device-weights bf16"; do
    # shellcheck disable=SC2086
    echo "$q [$d]: $(ppl --kv-quantize $q $d)"
  done
done
