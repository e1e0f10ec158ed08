#!/usr/bin/env bash
# One device run for issue 17, session 23 (docs/CUDA.md, "Session 23"): decode steps
# replayed as a captured CUDA graph (one sequence through the batched attention launch,
# its per-step values in device memory; keys rotated in the batched append).
#   PART=tests: cuda_backend_test as built (graphs off by default; DecodeGraphMatchesDirectLaunches
#     sets them itself), all of it again with PTLLM_CUDA_GRAPH=1, its graph and batch cases with
#     PTLLM_CUDA_GRAPH=1 PTLLM_CUDA_FUSE=0 (a separate RoPE launch inside the graph), and CPU vs
#     GPU greedy text and perplexity through the cache with graphs on;
#   PART=ab: per round, alternated: this build with PTLLM_CUDA_GRAPH=0 (the launches of
#     before), this one with graphs, and for batch 64 the previous build too
#     (prebuilt/bin-old.tar.xz): the 1B shape (bf16 weights) at batch 1, fp16 KV
#     at depth 0 and 4,096, int4 KV at 4,096; batch 8 x 4,096 int4 (a graphed batch); and
#     batch 64 x 8,192 of the 8B shape ($LAYERS layers), fp16 and int4 (cuBLAS: not graphed;
#     the batched append now rotates the keys). B64=0 skips those.
#   PART=bw: the copy bandwidth the percentages are taken of (cuda_attn_bench's copy).
# PART=all runs tests, bw and ab. Run from a folder holding prebuilt/ (bin.tar.xz: posttrainllm,
# cuda_backend_test and cuda_attn_bench built with -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite;
# bin-old.tar.xz; lib.tar.xz), shared-lite/ and cuda_device_env.sh. Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-3}; LAYERS=${LAYERS:-16}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
has() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
if has tests; then
  echo "== tests"
  timeout 400 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests.txt" |
    grep -E "FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|tests ran|graphs on|CUDA graphs off"
  echo "== tests, PTLLM_CUDA_GRAPH=1"
  PTLLM_CUDA_GRAPH=1 timeout 400 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests_graph.txt" |
    grep -E "FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|tests ran|graphs on|CUDA graphs off"
  export PTLLM_CUDA_GRAPH=1
  echo "== tests, PTLLM_CUDA_GRAPH=1 PTLLM_CUDA_FUSE=0"
  PTLLM_CUDA_FUSE=0 timeout 300 $B/cuda_backend_test --gtest_color=no --gtest_filter='*Graph*:*Batch*:*Stories*' 2>&1 |
    filter | tee "$OUT/tests_nofuse.txt" | grep -E "FAILED|PASSED|Failure|Expected|Which is|graphs on|CUDA graphs off"
  echo "== sample cpu vs cuda (stories260K, greedy)"
  sample_cpu_vs_gpu 200 "--kv-quantize fp16" "--kv-quantize int4" "--kv-quantize int2 --kivi-group 8 --kivi-residual 16" \
    "--kv-quantize fp16 --streaming-llm-sink 4 --streaming-llm-window 40" "--kv-quantize int4 --kivi-group 8 --kivi-residual 16 --streaming-llm-sink 4 --streaming-llm-window 40"
  echo "== perplexity through the cache, real text (stories260K, 4 windows of 256)"
  ppl_cpu_vs_gpu 4 "fp16" "int4" "int8 --kivi-group 8 --kivi-residual 16"
  unset PTLLM_CUDA_GRAPH
fi
if has bw; then
  echo "== copy bandwidth"
  PTLLM_BENCH_MODES=none timeout 120 $B/cuda_attn_bench 2>&1 | tee "$OUT/bw.txt" | tail -3
fi
if has ab; then
  [ -f $B/bin-old.tar.xz ] || { echo "PART=$PART needs $B/bin-old.tar.xz"; exit 1; }
  mkdir -p old && tar xJf $B/bin-old.tar.xz -C old
  [ -f /tmp/l1b.gguf ] || $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
  if [ "${B64:-1}" = 1 ] && [ ! -f /tmp/l8b.gguf ]; then
    $B/posttrainllm make-random /tmp/l8b.gguf --preset llama-3.1-8b --layers $LAYERS --type bf16 2>&1 | tail -1
  fi
  for round in $(seq "$ROUNDS"); do
    for v in old nograph graph; do
      bin=$B/posttrainllm; g=1
      [ $v = old ] && bin=old/posttrainllm
      [ $v = nograph ] && g=0
      for run in "1b fp16 1 0" "1b fp16 1 4096" "1b int4 1 4096" "1b int4 8 4096" "8b fp16 64 8192" "8b int4 64 8192"; do
        set -- $run
        [ "$1" = 8b ] && [ "${B64:-1}" != 1 ] && continue
        [ "$1" = 1b ] && [ $v = old ] && continue  # batch 1 and 8: the old path is PTLLM_CUDA_GRAPH=0's
        n=128; [ "$1" = 8b ] && n=32
        r=$(PTLLM_CUDA_GRAPH=$g timeout 200 $bin bench /tmp/l$1.gguf --device cuda -p 0 --json --batch $3 -d $4 -n $n \
            -r 3 --kv-quantize $2 2>&1 | tr -d '\n')
        echo "round $round $v $run $r" >> "$OUT/bench_ab.jsonl"; echo "$r" | show "r$round $v $1 b$3 d$4 $2"
      done
    done
  done
fi
