#!/usr/bin/env bash
# One device run for issue 17, session 22 (docs/CUDA.md, "Session 22"): a batched decode
# step's host work on the logits (the copy out of the page-locked buffer, each sequence's
# row into its decoder, the finiteness check) split across threads and vectorised.
#   PART=tests: cuda_backend_test, and CPU vs GPU greedy text and perplexity through the cache;
#   PART=ab: the previous build (prebuilt/bin-old.tar.xz: posttrainllm) against this one,
#     alternated over ROUNDS rounds: batch 64 x 8,192 stored tokens of the 8B shape ($LAYERS
#     layers, bf16 weights), fp16 and int4 KV; batch 16 int4 (RUNS: batch/KV pairs, default
#     "64/fp16 64/int4 16/int4"); 1B shape batch 1 (no change expected; B1=0 skips it).
# PART=all runs both. Run from a folder holding prebuilt/ (bin.tar.xz: posttrainllm and
# cuda_backend_test built with -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite; bin-old.tar.xz;
# lib.tar.xz), shared-lite/ and cuda_device_env.sh. Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-3}; LAYERS=${LAYERS:-16}; GEN=${GEN:-32}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
if [ "$PART" = all ] || [ "$PART" = ab ]; then
  [ -f $B/bin-old.tar.xz ] || { echo "PART=$PART needs $B/bin-old.tar.xz (the previous build's posttrainllm)"; exit 1; }
  mkdir -p old && tar xJf $B/bin-old.tar.xz -C old
fi
if [ "$PART" = all ] || [ "$PART" = tests ]; then
  echo "== tests"
  timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests.txt" |
    grep -E "FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|tests ran"
  echo "== sample cpu vs cuda (stories260K, greedy)"
  sample_cpu_vs_gpu 200 "--kv-quantize fp16" "--kv-quantize int4" "--kv-quantize int2 --kivi-group 8 --kivi-residual 16"
  echo "== perplexity through the cache, real text (stories260K, 4 windows of 256)"
  ppl_cpu_vs_gpu 4 "fp16" "int4" "int8 --kivi-group 8 --kivi-residual 16"
fi
if [ "$PART" = all ] || [ "$PART" = ab ]; then
  echo "== Llama-3.1-8B shape, $LAYERS layers, bf16 weights, random"
  [ -f /tmp/l8b.gguf ] || $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -1
  [ -f /tmp/l1b.gguf ] || [ "${B1:-1}" != 1 ] || $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
  for round in $(seq "$ROUNDS"); do
    for bin in old/posttrainllm $B/posttrainllm; do
      for run in ${RUNS:-64/fp16 64/int4 16/int4}; do
        set -- ${run/\// }
        r=$(timeout 200 $bin bench /tmp/l8b.gguf --device cuda -p 0 --json --batch $1 -d 8192 -n $GEN -r 3 \
            --kv-quantize $2 2>&1 | tr -d '\n')
        echo "round $round $bin b$1 $2 $r" >> "$OUT/bench_ab.jsonl"; echo "$r" | show "round $round ${bin%%/*} b$1 $2"
      done
      [ "${B1:-1}" = 1 ] || continue
      r=$(timeout 100 $bin bench /tmp/l1b.gguf --device cuda --kv-quantize fp16 -p 0 -n 128 -r 3 --json 2>&1 | tr -d '\n')
      echo "round $round $bin 1b b1 fp16 $r" >> "$OUT/bench_ab.jsonl"; echo "$r" | show "round $round ${bin%%/*} 1B b1 fp16"
    done
  done
fi
