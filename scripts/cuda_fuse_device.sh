#!/usr/bin/env bash
# One device run for session 17's launch savings on the GPU (docs/CUDA.md, "Session 17"):
# a plain cache's key RoPE done by its append (one launch less per layer for a sequence
# stepped alone) and no combine launch when the attention has one split. First the GPU tests
# with the new binaries (and again with PTLLM_CUDA_FUSE=0, the unfused launches), CPU vs GPU
# sample text and perplexity through the cache (stories260K); then batch-1 decode of the 1B
# shape with the previous build (prebuilt/bin-old.tar.xz, unpacked to prebuilt/old) and this
# one alternated, ROUNDS rounds, and batch 64 x 8K of the 8B shape (whose attention has many
# splits: unchanged, a check that nothing there moved). Run from a folder holding prebuilt/
# (as cuda_pdl_device.sh), shared-lite/ and cuda_device_env.sh. PART=tests|b1|batch|all.
# Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-3}; N=${N:-128}; LAYERS=${LAYERS:-16}; GEN=${GEN:-32}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
OLD=$B/old/posttrainllm
if [ ! -x "$OLD" ] && [ -f $B/bin-old.tar.xz ]; then mkdir -p $B/old && tar xJf $B/bin-old.tar.xz -C $B/old; fi
summary() { grep -E "FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|tests ran"; }
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  echo "== tests (fused launches, the default)"
  timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests.txt" | summary
  echo "== tests, PTLLM_CUDA_FUSE=0"
  PTLLM_CUDA_FUSE=0 timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests_nofuse.txt" | summary
  KIVI="--kivi-group 8 --kivi-residual 16"
  echo "== sample cpu vs cuda (stories260K, greedy, 200 tokens)"
  sample_cpu_vs_gpu 200 "--kv-quantize fp16" "--kv-quantize fp32" "--kv-quantize bf16 --streaming-llm-sink 4 --streaming-llm-window 40" \
    "--kv-quantize int4 $KIVI" "--kv-quantize int8"
  echo "== perplexity through the cache, CPU vs GPU (stories260K, the held-out Alice text, windows of 256)"
  ppl_cpu_vs_gpu 32 "fp16" "fp32" "bf16" "int8 $KIVI" "int4 $KIVI" "fp16 --streaming-llm-sink 4 --streaming-llm-window 100"
fi
if [ "$PART" = all ] || [ "$PART" = b1 ]; then
  echo "== Llama-3.2-1B shape, bf16 weights, batch 1: previous build and this one alternated ($ROUNDS rounds)"
  $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
  for round in $(seq "$ROUNDS"); do
    for bin in old new; do
      p=$B/posttrainllm; [ $bin = old ] && p=$OLD
      [ -x "$p" ] || { echo "no $bin binary"; continue; }
      for d in 0 4096; do
        for kv in fp16 int4; do
          [ "$d" = 0 ] && [ "$kv" = int4 ] && continue
          r=$(timeout 100 $p bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n "$N" -r 3 -d $d --json 2>&1 | tr -d '\n')
          echo "bin=$bin d=$d kv=$kv round=$round $r" >> "$OUT/bench_1b.jsonl"
          echo "$r" | show "round $round $bin d=$d $kv"
        done
      done
    done
  done
  echo "== copy bandwidth"
  PTLLM_BENCH_MODES=fp16 timeout 60 $B/cuda_attn_bench 8192 2>&1 | grep -i "bandwidth\|copy" | head -3
fi
if [ "$PART" = all ] || [ "$PART" = batch ]; then
  echo "== Llama-3.1-8B shape, $LAYERS layers, bf16 weights; batch 64 x 8,192 stored tokens, fp16 / int4"
  $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -1
  for round in 1 2; do
    for kv in fp16 int4; do
      r=$(timeout 200 $B/posttrainllm bench /tmp/l8b.gguf --device cuda -p 0 --json --batch 64 -d 8192 -n $GEN -r 3 \
          --kv-quantize $kv 2>&1 | tr -d '\n')
      echo "round $round $kv $r" >> "$OUT/bench_b64.jsonl"; echo "$r" | show "round $round $kv"
    done
  done
fi
