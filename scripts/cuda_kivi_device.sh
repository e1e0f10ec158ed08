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
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$OUT/gpu.txt"
# The test binary looks for its fixtures where it was configured.
ln -sfn "$PWD/shared-lite" /tmp/ptllm-shared-lite
export LD_LIBRARY_PATH=$PWD/prebuilt/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
B=prebuilt
[ -d $B/lib ] || tar xzf $B/lib.tar.gz -C $B  # the libraries travel packed (transfer size limit)
if ! $B/posttrainllm --help >/dev/null 2>&1; then
  echo "prebuilt binaries do not run here"; ldd $B/posttrainllm | grep "not found"; exit 1
fi
echo "== tests"
timeout 300 $B/cuda_backend_test --gtest_color=no ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} 2>&1 |
  grep -v "^\[ RUN\|Google Test trace" | tee "$OUT/tests.txt" | grep -v "^\[       OK\|^$"
M=shared-lite/models/stories260K
KIVI="--kivi-group 8 --kivi-residual 16"
echo "== sample cpu vs cuda (stories260K, greedy, int4 G8 R16 and int2 G8 R16 sink 4 + window 40)"
i=0
for q in "--kv-quantize int4 $KIVI" "--kv-quantize int2 $KIVI --streaming-llm-sink 4 --streaming-llm-window 40" \
         "--kv-quantize int8"; do
  i=$((i + 1))
  $B/posttrainllm sample $M -p "Once upon a time" -n 100 -t 0 $q > "$OUT/s${i}_cpu.txt" 2>/dev/null
  $B/posttrainllm sample $M -p "Once upon a time" -n 100 -t 0 $q --device cuda > "$OUT/s${i}_gpu.txt" 2>/dev/null
  echo "[$q]"; head -c 200 "$OUT/s${i}_gpu.txt"; echo
  cmp -s "$OUT/s${i}_cpu.txt" "$OUT/s${i}_gpu.txt" && echo "sample text identical" || diff "$OUT/s${i}_cpu.txt" "$OUT/s${i}_gpu.txt" | head -6
done
echo "== refused on the GPU (one line each)"
for q in "--kv-quantize int3" "--kv-quantize int4 --kivi-group 0" "--kv-quantize int4 --kv-rotate hadamard" \
         "--kv-quantize int4 --kivi-k-axis token"; do
  $B/posttrainllm sample $M -p "Once" -n 4 -t 0 $q --device cuda 2>&1 >/dev/null | tail -2
done
echo "== perplexity through the cache, real text (stories260K, 4 windows of 256)"
for q in "int8 $KIVI" "int4 $KIVI" "int2 $KIVI" "int4" "int4 $KIVI --streaming-llm-sink 4 --streaming-llm-window 100"; do
  for dev in cpu cuda; do
    r=$($B/posttrainllm perplexity $M shared-lite/text.txt -w 256 -k 4 --cache-only -q --json --device $dev \
        --kv-quantize $q 2>&1 | tr -d '\n')
    echo "$dev [$q] $r" >> "$OUT/ppl.jsonl"
    echo "$r" | python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]['through_cache']; print('$dev', '[$q]', 'ppl', repr(r['ppl']), 'bytes', r['max_cache_bytes'])" 2>/dev/null || echo "$dev [$q] $r" | cut -c1-300
  done
done
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
