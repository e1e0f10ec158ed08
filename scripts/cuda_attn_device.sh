#!/usr/bin/env bash
# One device run for issue 17's KIVI decode attention (docs/CUDA.md, "Session 14"):
# the GPU tests (the kernel by plan: tiled where splits hold 2+ tiles) and the KIVI
# tests with each kernel forced; CPU vs GPU
# through the CLI; then one layer's decode attention alone (cuda_attn_bench) with
# the kernels alternated, ncu of the int4 kernel + combine at 32K, and (PART=all or
# batch) batch-64 decode at 8K stored tokens of the 8B shape, fp16 against int4
# with each kernel. Run from a folder holding prebuilt/ (posttrainllm,
# cuda_backend_test, cuda_attn_bench built with -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite;
# lib.tar.gz: the .so files the device lacks), shared-lite/ and cuda_device_env.sh.
# PART=tests|micro|batch|all (default all; micro and batch skip the tests). (Session 14's
# fourth call ran a PART=minb, since removed with the PTLLM_CUDA_KIVI_MINB switch it timed.)
# ROUNDS (default 2) rounds of alternation (MICRO_ROUNDS for the attention alone,
# default 1). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-2}; LAYERS=${LAYERS:-16}; GEN=${GEN:-32}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  echo "== tests (defaults)"
  timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests.txt" |
    grep -E "FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|step |tests ran"
  for v in "PTLLM_CUDA_KIVI_DEC=2" "PTLLM_CUDA_KIVI_DEC=1" "PTLLM_CUDA_KIVI_DEC=0" "PTLLM_CUDA_KIVI_NT=2"; do
    echo "== the KIVI model-level and batch tests with $v"
    env $v timeout 200 $B/cuda_backend_test --gtest_color=no \
      --gtest_filter='*BatchKivi*:*Stories260K*:*Llama*:*Qwen*:*Batch*' 2>&1 | filter |
      sed "s/^/$v: /" | tee -a "$OUT/tests_kivi_variants.txt" | grep -v "OK \]\|: $\|max rel"
  done
  KIVI="--kivi-group 8 --kivi-residual 16"
  echo "== sample cpu vs cuda (stories260K, greedy)"
  sample_cpu_vs_gpu 200 "--kv-quantize int4 $KIVI" "--kv-quantize int2 $KIVI --streaming-llm-sink 4 --streaming-llm-window 40" \
    "--kv-quantize int8" "--kv-quantize int4"
  echo "== perplexity through the cache, real text (stories260K, 4 windows of 256)"
  ppl_cpu_vs_gpu 4 "int8 $KIVI" "int4 $KIVI" "int2 $KIVI" "int4" "int4 $KIVI --streaming-llm-sink 4 --streaming-llm-window 100"
fi
if [ "$PART" = all ] || [ "$PART" = micro ]; then
  echo "== decode attention alone (one layer, 8 KV heads x 128, 32 query heads), kernels alternated"
  # kind 1: the session-7 kernel; kind 2: tiled; DEC=-1: by plan (the default).
  for round in $(seq "${MICRO_ROUNDS:-1}"); do
    for v in "PTLLM_CUDA_KIVI_DEC=1" "PTLLM_CUDA_KIVI_DEC=2" "PTLLM_CUDA_KIVI_DEC=-1"; do
      env $v PTLLM_BENCH_MODES=${MODES:-int8,int4,int2} timeout 120 $B/cuda_attn_bench 8192 32768 2>&1 |
        grep decode_attention | sed "s/^/round $round $v /" | tee -a "$OUT/attn.txt"
    done
  done
  echo "== tiles per split at 32K, int4, tiled kernel"
  for nt in ${NTS-2 4 8}; do
    PTLLM_CUDA_KIVI_NT=$nt PTLLM_BENCH_MODES=int4 timeout 60 $B/cuda_attn_bench 32768 2>&1 |
      grep decode_attention | sed "s/^/NT=$nt /" | tee -a "$OUT/attn.txt"
  done
  echo "== fp16 (plain cache) and the copy bandwidth, same process"
  PTLLM_BENCH_MODES=fp16 timeout 60 $B/cuda_attn_bench 8192 32768 2>&1 | tee -a "$OUT/attn.txt"
  if command -v ncu >/dev/null; then
    for k in 1 2; do
      echo "== ncu, PTLLM_CUDA_KIVI_DEC=$k: the int4 decode kernel and the split combine apart, 32K (--clock-control none;"
      echo "   the combines of grid 16384 are the fill's prefill chunks)"
      PTLLM_CUDA_KIVI_DEC=$k PTLLM_BENCH_MODES=int4 timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
        -c 100 -k regex:"attend_kivi_(dec|tile)|combine" $B/cuda_attn_bench 32768 > "$OUT/ncu_dec$k.txt" 2>&1
      python3 - "$OUT/ncu_dec$k.txt" <<'PY'
import re, sys, collections
d = collections.defaultdict(lambda: collections.defaultdict(list)); name = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s+(?:void )?(.*?) \((\d+), (\d+), (\d+)\)x\(", line)
    if m:
        k = re.search(r"(\w+_kernel(<[^>]*>)?)", m.group(1))
        name = (k.group(1) if k else m.group(1)[:40]) + " grid(%s,%s,%s)" % m.group(2, 3, 4)
    m = re.search(r"(gpu__time_duration.sum|dram__bytes_read.sum|launch__registers_per_thread|sm__warps_active\S*)\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(3).replace(",", ""))
        if m.group(1).startswith("gpu__time") and m.group(2) == "ns": v *= 1e-3
        if m.group(1).startswith("dram") and m.group(2) == "Kbyte": v *= 1e-3
        if m.group(1).startswith("dram") and m.group(2) == "Gbyte": v *= 1e3
        d[name][m.group(1)].append(v)
for k, ms in d.items():
    out = []
    for met, v in ms.items():
        v.sort(); out.append("%s %.2f" % (met.split("__")[1].split(".")[0], v[len(v) // 2]))
    print("%-64s n %4d  %s" % (k[:64], len(ms["gpu__time_duration.sum"]), "  ".join(out)))
PY
    done
  fi
fi
if [ "$PART" = all ] || [ "$PART" = batch ]; then
  echo "== Llama-3.1-8B shape, $LAYERS layers, bf16 weights, random; batch 64 x 8,192 stored tokens"
  /usr/bin/time -f "make-random %e s" $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -2
  for round in $(seq "$ROUNDS"); do
    for v in "PTLLM_CUDA_KIVI_DEC=-1 fp16" "PTLLM_CUDA_KIVI_DEC=-1 int4" "PTLLM_CUDA_KIVI_DEC=1 int4"; do
      set -- $v
      r=$(env $1 timeout 200 $B/posttrainllm bench /tmp/l8b.gguf --device cuda -p 0 --json --batch 64 -d 8192 -n $GEN -r 3 \
          --kv-quantize $2 2>&1 | tr -d '\n')
      echo "round $round $v $r" >> "$OUT/bench_b64.jsonl"; echo "$r" | show "round $round $v"
    done
  done
  echo "== Llama-3.2-1B shape, batch 1 (the GEMV cleanup: no change expected)"
  $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
  for kv in fp16 int4; do
    r=$(timeout 100 $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n 128 -r 3 -d 4096 --json 2>&1 | tr -d '\n')
    echo "1b d4096 $kv $r" >> "$OUT/bench_1b.jsonl"; echo "$r" | show "1b b1 d4096 $kv"
  done
fi
