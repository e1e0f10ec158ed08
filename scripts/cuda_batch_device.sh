#!/usr/bin/env bash
# One device run for issue 17's batched decode (docs/BENCHMARKS.md, docs/CUDA.md):
# the GPU tests, CPU vs GPU through the CLI, then batch-64 decode at 8K stored
# tokens per sequence on a random Llama-3.1-8B-shaped model (LAYERS of them),
# fp16 vs int4 KV, side by side with transformers (fp16 SDPA, static cache) and
# the memory bandwidth, in this one command. Run from a folder with prebuilt/
# (posttrainllm, cuda_backend_test built elsewhere with
# -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite; lib.tar.gz: the .so files the
# device lacks), shared-lite/ (fixtures, stories260K, text.txt) and
# cuda_batch_anchor.py and cuda_device_env.sh. PART=tests|micro|bench|all (default all).
# Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; LAYERS=${LAYERS:-16}; GEN=${GEN:-32}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
if [ "$PART" != bench ]; then
  echo "== tests (defaults: cuBLAS from 16 rows, batched attention launches from 2 sequences)"
  timeout 240 $B/cuda_backend_test --gtest_color=no 2>&1 | grep -v "^\[ RUN\|Google Test trace" |
    tee "$OUT/tests.txt" | grep -v "^\[       OK\|^$"
  echo "== the same model-level tests on the previous paths (GEMV only, per-sequence launches)"
  PTLLM_CUDA_GEMM_ROWS=0 PTLLM_CUDA_BATCH_LAUNCH=0 timeout 200 $B/cuda_backend_test --gtest_color=no \
    --gtest_filter='*Batch*:*Stories260K*:*Llama*:*Qwen*:*Mistral*:*TinyGpt*' 2>&1 |
    grep -v "^\[ RUN\|Google Test trace" | tee "$OUT/tests_old_paths.txt" | grep -v "^\[       OK\|^$"
  echo "== the KIVI decode tests with the general kernel (PTLLM_CUDA_KIVI_DEC=0)"
  PTLLM_CUDA_KIVI_DEC=0 timeout 120 $B/cuda_backend_test --gtest_color=no --gtest_filter='*KiviLayer*:*BatchKivi*' 2>&1 |
    grep -v "^\[ RUN\|Google Test trace" | sed "s/^/PTLLM_CUDA_KIVI_DEC=0: /" | tee -a "$OUT/tests_kivi_variants.txt" |
    grep -v "OK \]\|: $"
  KIVI="--kivi-group 8 --kivi-residual 16"
  echo "== sample cpu vs cuda (stories260K, greedy)"
  sample_cpu_vs_gpu 100 "--kv-quantize fp16" "--kv-quantize int4 $KIVI" \
    "--kv-quantize int2 $KIVI --streaming-llm-sink 4 --streaming-llm-window 40" "--kv-quantize int8"
  echo "== perplexity through the cache, real text (stories260K, 4 windows of 256: prefill chunks through cuBLAS)"
  ppl_cpu_vs_gpu 4 "fp16" "int8 $KIVI" "int4 $KIVI" "int2 $KIVI" "int4 $KIVI --streaming-llm-sink 4 --streaming-llm-window 100"
fi
[ "$PART" = tests ] && exit 0
if [ "$PART" = micro ] || [ "$PART" = all ]; then
  echo "== decode attention alone (one layer, 8 KV heads x 128, 32 query heads), CUDA events"
  timeout 200 $B/cuda_attn_bench ${DEPTHS:-32768} 2>&1 | tee -a "$OUT/attn.jsonl"
  if command -v ncu >/dev/null; then
    echo "== ncu: the int4 decode kernel and the split combine apart, 32K (kernel durations, --clock-control none)"
    for k in 1; do
      PTLLM_CUDA_KIVI_DEC=$k PTLLM_BENCH_MODES=int4 timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum -c 200 \
        -k regex:"attend_kivi_dec|combine" $B/cuda_attn_bench 32768 > "$OUT/ncu_dec$k.txt" 2>&1
      python3 - "$OUT/ncu_dec$k.txt" <<'PY'
import re, sys, collections
d = collections.defaultdict(list); name = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s+(?:void )?(.*?) \((\d+), (\d+), (\d+)\)x\(", line)
    if m:
        k = re.search(r"(\w+_kernel(<[^>]*>)?)", m.group(1))
        name = (k.group(1) if k else m.group(1)[:40]) + " grid(%s,%s,%s)" % m.group(2, 3, 4)
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(2).replace(",", "")); d[name].append(v * (1e-3 if m.group(1) == "ns" else 1))
for k, v in d.items():
    v.sort(); print("%-60s n %4d  median %.2f us  min %.2f us" % (k[:60], len(v), v[len(v) // 2], v[0]))
PY
    done
  fi
  echo "== Llama-3.2-1B shape, batch 1 (goal: >= 70% of bandwidth)"
  $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
  for kv in fp16 int4; do
    r=$(timeout 100 $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n 128 -r 3 -d 0 --json 2>&1 | tr -d '\n')
    echo "1b b1 d0 $kv $r" >> "$OUT/bench_1b.jsonl"
    echo "$r" | python3 -c "import json,sys; d=json.load(sys.stdin)['decode']; print('1b b1 d0 $kv tok/s %.1f +- %.1f read %.0f GB/s' % (d['tps_mean'], d['tps_sd'], d['achieved_read_gb_per_s']))" 2>/dev/null || echo "$r" | cut -c1-300
  done
  [ "$PART" = micro ] && exit 0
fi
show() {  # one bench JSON line -> a summary
  python3 -c "
import json,sys
j=json.loads(sys.stdin.read()); d=j['decode']
print('%-34s tok/s %8.1f +- %6.1f  ms/step %7.2f  cache/seq %s  device/seq %s  read %.0f GB/s' % ('$1', d['tps_mean'], d['tps_sd'], d.get('ms_per_step', 1000/d['tps_mean']), d['cache_bytes_at_end'], d.get('device_bytes_per_sequence'), d['achieved_read_gb_per_s']))" 2>/dev/null || cut -c1-400
}
bench() {  # name, args...
  local name=$1; shift
  r=$(timeout 200 $B/posttrainllm bench /tmp/l8b.gguf --device cuda -p 0 --json "$@" 2>&1 | tr -d '\n')
  echo "$name $r" >> "$OUT/bench.jsonl"; echo "$r" | show "$name"
}
echo "== Llama-3.1-8B shape, $LAYERS layers, bf16 weights, random"
/usr/bin/time -f "make-random %e s" $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -2
echo "== batch 64, 8192 stored tokens per sequence (first filled by prefill, the other 63 device copies of it)"
uptime
for round in 1 2; do
  bench "b64 d8192 fp16 (r$round)" --batch 64 -d 8192 -n $GEN -r 3 --kv-quantize fp16
  bench "b64 d8192 int4 G32 R128 (r$round)" --batch 64 -d 8192 -n $GEN -r 3 --kv-quantize int4
  [ $round = 1 ] && { echo "== transformers fp16 SDPA static cache, same shape, batch 64, depth 8192";
    timeout 300 python3 cuda_batch_anchor.py $LAYERS 64 8192 $((GEN + 4)) 2>&1 | grep -v Warning | tee -a "$OUT/anchor.jsonl"; }
done
echo "== the previous paths at batch 64 (GEMV, per-sequence launches), fp16 and int4"
PTLLM_CUDA_GEMM_ROWS=0 PTLLM_CUDA_BATCH_LAUNCH=0 bench "b64 d8192 fp16 old paths" --batch 64 -d 8192 -n 8 -r 2 --kv-quantize fp16
PTLLM_CUDA_GEMM_ROWS=0 PTLLM_CUDA_BATCH_LAUNCH=0 bench "b64 d8192 int4 old paths" --batch 64 -d 8192 -n 8 -r 2 --kv-quantize int4
echo "== memory per sequence at 8192 tokens (device allocation), the other modes"
bench "b2 d8192 int2 G32 R128" --batch 2 -d 8192 -n 4 -r 1 --kv-quantize int2
bench "b2 fp16 sink 4 + window 2044" --batch 2 -d 64 -n 4 -r 1 --kv-quantize fp16 --streaming-llm-sink 4 --streaming-llm-window 2044
bench "b2 int4 sink 4 + window 2044" --batch 2 -d 64 -n 4 -r 1 --kv-quantize int4 --streaming-llm-sink 4 --streaming-llm-window 2044
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
