#!/usr/bin/env bash
# Issue 17, session 28: the GPU cache's two copies (CudaCache::copy_from, and the RoPE slot
# table at a KIVI cache's start) go on the engine's stream instead of a cudaMemcpy plus a wait
# for the legacy stream. Runs all of cuda_backend_test (with the new
# CopiedCacheDecodesAsItsSource: a copied cache decodes as its source, bit for bit), greedy
# text and perplexity through the cache CPU against GPU for settings that read the slot table
# (grouped KIVI, StreamingLLM windows), and `bench --batch` on the GPU, whose sequences after
# the first are device copies. Staged as the other device scripts are (prebuilt/, shared-lite/,
# cuda_device_env.sh beside it): cd build-stage && bash THIS.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. ./cuda_device_env.sh
device_preamble
T=$B/cuda_backend_test
echo "== all tests"
timeout 300 $T > "$OUT/all.txt" 2>&1; echo "rc $?"
grep -E '^\[  (FAILED|PASSED)|tests ran|CopiedCache' "$OUT/all.txt" | head -20
echo "== greedy text, CPU against GPU (200 tokens)"
sample_cpu_vs_gpu 200 "--kv-quantize fp16 --streaming-llm-sink 4 --streaming-llm-window 40" \
  "--kv-quantize int4 --kivi-group 8 --kivi-residual 16 --streaming-llm-sink 4 --streaming-llm-window 40" \
  "--kv-quantize int2 --kivi-group 8 --kivi-residual 16"
echo "== perplexity through the cache, CPU against GPU (4 windows of 256)"
ppl_cpu_vs_gpu 4 fp16 int4 "int8 --kivi-group 8 --kivi-residual 16" \
  "int4 --kivi-group 8 --kivi-residual 16 --streaming-llm-sink 4 --streaming-llm-window 60"
echo "== bench --batch 8 (sequences 2-8 copied on the device)"
for q in fp16 int4; do
  $B/posttrainllm bench shared-lite/models/stories260K --device cuda --kv-quantize $q -b 8 -d 200 -p 0 -n 64 -r 2 --json 2>&1 |
    python3 -c "import json,sys; j=json.load(sys.stdin); d=j['decode']; print('$q', d.get('fill'), round(d['tps_mean'],1), 'tok/s')" 2>&1 | tail -1
done
