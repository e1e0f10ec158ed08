#!/usr/bin/env bash
# One device run for grouped KIVI on the GPU (issue 17): the GPU tests (label
# cuda), CPU vs GPU through the CLI (greedy text, perplexity through the cache on
# real text) and the decode bench of docs/BENCHMARKS.md. Run from a folder with
# prebuilt/ (posttrainllm, cuda_backend_test built elsewhere with
# -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite, and prebuilt/lib or lib.tar.gz: the
# .so files the device lacks) and shared-lite/ (fixtures/hf, fixtures/tinygpt,
# models/stories260K, text.txt). Results go to $OUT. PART=tests skips the bench.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble, *_cpu_vs_gpu
device_preamble
echo "== tests"
timeout 300 $B/cuda_backend_test --gtest_color=no ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} 2>&1 |
  grep -v "^\[ RUN\|Google Test trace" | tee "$OUT/tests.txt" | grep -v "^\[       OK\|^$"
M=shared-lite/models/stories260K
KIVI="--kivi-group 8 --kivi-residual 16"
echo "== sample cpu vs cuda (stories260K, greedy, int4 G8 R16 and int2 G8 R16 sink 4 + window 40)"
sample_cpu_vs_gpu 100 "--kv-quantize int4 $KIVI" "--kv-quantize int2 $KIVI --streaming-llm-sink 4 --streaming-llm-window 40" \
  "--kv-quantize int8"
echo "== refused on the GPU (one line each)"
for q in "--kv-quantize int3" "--kv-quantize int4 --kivi-group 0" "--kv-quantize int4 --kv-rotate hadamard" \
         "--kv-quantize int4 --kivi-k-axis token"; do
  $B/posttrainllm sample $M -p "Once" -n 4 -t 0 $q --device cuda 2>&1 >/dev/null | tail -2
done
echo "== perplexity through the cache, real text (stories260K, 4 windows of 256)"
ppl_cpu_vs_gpu 4 "int8 $KIVI" "int4 $KIVI" "int2 $KIVI" "int4" "int4 $KIVI --streaming-llm-sink 4 --streaming-llm-window 100"
[ "${PART:-}" = tests ] && exit 0
echo "== 1B-shaped random model, single-sequence decode (bench has no batch option)"
$B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
for d in 4096 0; do
  kvs="fp16 int4 int8 int2"; [ $d = 0 ] && kvs="fp16 int4"
  for kv in $kvs; do
    timeout 100 $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n 128 -r 3 -d $d --json 2>&1 |
      tr -d '\n' >> "$OUT/bench_1b.jsonl"; echo >> "$OUT/bench_1b.jsonl"
    tail -1 "$OUT/bench_1b.jsonl" | python3 -c "import json,sys; j=json.load(sys.stdin)['decode']; print('d $d $kv', 'tok/s %.1f +- %.1f' % (j['tps_mean'], j['tps_sd']), 'cache bytes', j['cache_bytes_at_end'], 'weights', j['weight_bytes_per_token'])" 2>/dev/null || tail -1 "$OUT/bench_1b.jsonl" | cut -c1-300
  done
done
echo "== deeper: 16K tokens in the cache"
for kv in fp16 int4; do
  timeout 150 $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n 128 -r 3 -d 16384 --json 2>&1 |
    tr -d '\n' >> "$OUT/bench_1b.jsonl"; echo >> "$OUT/bench_1b.jsonl"
  tail -1 "$OUT/bench_1b.jsonl" | python3 -c "import json,sys; j=json.load(sys.stdin)['decode']; print('d 16384 $kv', 'tok/s %.1f +- %.1f' % (j['tps_mean'], j['tps_sd']), 'cache bytes', j['cache_bytes_at_end'])" 2>/dev/null || tail -1 "$OUT/bench_1b.jsonl" | cut -c1-300
done
