#!/usr/bin/env bash
# One device run for issue 17's programmatic dependent launches (docs/CUDA.md,
# "Session 15"): the GPU tests with PDL (the default, twice: a missing wait would
# show as an intermittent mismatch) and without (PTLLM_CUDA_PDL=0); CPU vs GPU
# sample text and perplexity through the cache (stories260K; 4 and 32 windows of
# 256); then batch-1 decode of the 1B shape and batch-64 decode at 8K stored tokens
# of the 8B shape, PTLLM_CUDA_PDL=0 and 1 alternated. Run from a folder holding
# prebuilt/ (posttrainllm, cuda_backend_test, cuda_attn_bench built with
# -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite, as bin.tar.xz; lib.tar.gz: the .so
# files the device lacks), shared-lite/ and cuda_device_env.sh.
# PART=tests|b1|batch|all (default all), or nt: batch 64 x 8K int4 with the KIVI decode
# kernel's tiles per split forced (PTLLM_CUDA_KIVI_NT in NTS), kind 1, and the plan, against
# fp16, alternated. ROUNDS (default 3) rounds of alternation.
# Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-3}; LAYERS=${LAYERS:-16}; GEN=${GEN:-32}; N=${N:-128}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
summary() { grep -E "FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|tests ran"; }
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  for run in 1 2; do
    echo "== tests, PDL on (the default), run $run"
    timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests_pdl$run.txt" | summary
  done
  echo "== tests, PTLLM_CUDA_PDL=0"
  PTLLM_CUDA_PDL=0 timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests_nopdl.txt" | summary
  KIVI="--kivi-group 8 --kivi-residual 16"
  echo "== sample cpu vs cuda (stories260K, greedy, 200 tokens)"
  sample_cpu_vs_gpu 200 "--kv-quantize fp16" "--kv-quantize int4 $KIVI" \
    "--kv-quantize int2 $KIVI --streaming-llm-sink 4 --streaming-llm-window 40" "--kv-quantize int8"
  echo "== perplexity through the cache, CPU vs GPU (stories260K, the held-out Alice text, windows of 256)"
  for k in 4 32; do
    ppl_cpu_vs_gpu $k "fp16" "int8 $KIVI" "int4 $KIVI" "int2 $KIVI" "int4" \
      "int4 $KIVI --streaming-llm-sink 4 --streaming-llm-window 100" "int2 $KIVI --streaming-llm-sink 4 --streaming-llm-window 100"
  done
fi
if [ "$PART" = all ] || [ "$PART" = b1 ]; then
  echo "== Llama-3.2-1B shape, bf16 weights, batch 1: PTLLM_CUDA_PDL=0 and 1 alternated ($ROUNDS rounds)"
  $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
  for round in $(seq "$ROUNDS"); do
    for pdl in 0 1; do
      for d in 0 4096; do
        for kv in fp16 int4; do
          [ "$d" = 0 ] && [ "$kv" = int4 ] && continue
          r=$(PTLLM_CUDA_PDL=$pdl timeout 100 $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv \
              -p 0 -n "$N" -r 3 -d $d --json 2>&1 | tr -d '\n')
          echo "pdl=$pdl d=$d kv=$kv round=$round $r" >> "$OUT/bench_1b.jsonl"
          echo "$r" | show "round $round pdl=$pdl d=$d $kv"
        done
      done
    done
  done
  echo "== copy bandwidth"
  PTLLM_BENCH_MODES=fp16 timeout 60 $B/cuda_attn_bench 8192 2>&1 | grep -i "bandwidth\|copy" | head -3
  if command -v nsys >/dev/null; then
    for pdl in 0 1; do
      echo "== nsys, PTLLM_CUDA_PDL=$pdl, 1B d0, 32 decode steps: kernel time against the wall clock"
      PTLLM_CUDA_PDL=$pdl timeout 200 nsys profile -o /tmp/prof$pdl -f true -t cuda --stats=false \
        $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize fp16 -p 0 -n 32 -r 1 -d 0 >/dev/null 2>&1
      nsys stats -q --report cuda_gpu_kern_sum --format csv -o /tmp/nsys_pdl$pdl /tmp/prof$pdl.nsys-rep >/dev/null 2>&1
      f=/tmp/nsys_pdl${pdl}_cuda_gpu_kern_sum.csv
      [ -f "$f" ] && python3 - "$f" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r.get("Total Time (ns)", 0) or 0) for r in rows)
print("kernels total %.2f ms" % (tot / 1e6))
for r in rows[:10]:
    print("  %6.1f%%  %8.2f ms  n %6s  %s" % (float(r.get("Time (%)", 0)), float(r["Total Time (ns)"]) / 1e6, r.get("Instances", ""), (r.get("Name") or "")[:80]))
PY
    done
  fi
fi
if [ "$PART" = all ] || [ "$PART" = batch ]; then
  echo "== Llama-3.1-8B shape, $LAYERS layers, bf16 weights; batch 64 x 8,192 stored tokens, PDL 0 / 1 alternated"
  /usr/bin/time -f "make-random %e s" $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -2
  for round in $(seq "$ROUNDS"); do
    for v in "0 fp16" "0 int4" "1 fp16" "1 int4"; do
      set -- $v
      r=$(PTLLM_CUDA_PDL=$1 timeout 200 $B/posttrainllm bench /tmp/l8b.gguf --device cuda -p 0 --json --batch 64 -d 8192 \
          -n $GEN -r 3 --kv-quantize $2 2>&1 | tr -d '\n')
      echo "round $round pdl=$1 $2 $r" >> "$OUT/bench_b64.jsonl"; echo "$r" | show "round $round pdl=$1 $2"
    done
  done
fi
if [ "$PART" = nt ]; then
  echo "== Llama-3.1-8B shape, $LAYERS layers; batch 64 x 8,192: fp16, int4 by plan, kind 1, tiled with NT in ${NTS:=2 3 8 16}"
  $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -1
  for round in $(seq "$ROUNDS"); do
    set -- "X=0 fp16" "X=0 int4" "PTLLM_CUDA_KIVI_DEC=1 int4"
    for nt in $NTS; do set -- "$@" "PTLLM_CUDA_KIVI_NT=$nt int4"; done
    for v in "$@"; do
      set -- $v
      r=$(env $1 timeout 200 $B/posttrainllm bench /tmp/l8b.gguf --device cuda -p 0 --json --batch 64 -d 8192 \
          -n $GEN -r 3 --kv-quantize $2 2>&1 | tr -d '\n')
      echo "round $round $1 $2 $r" >> "$OUT/bench_nt.jsonl"; echo "$r" | show "round $round $1 $2"
    done
  done
fi
