#!/usr/bin/env bash
# One device run for issue 17, session 25's kernels (written without a GPU; docs/CUDA.md,
# "Session 25"), each behind a variable that is off by default: the RMSNorm folded into the
# one-row GEMV after it (PTLLM_CUDA_NORM_FOLD=1), the row-walking SwiGLU GEMV at 4 words per
# lane per chunk (PTLLM_CUDA_GLU_U=4) and the GEMVs' L2 prefetch of the next GEMV's weights
# (PTLLM_CUDA_L2_PREFETCH=MB).
#   PART=tests: cuda_backend_test as built (all off; the NormFolded* and L2Prefetch* cases set
#     theirs themselves), all of it again with the three on, and perplexity through the cache
#     on real text with bf16 weights on the GPU, fold off / on;
#   PART=ab: per round, the settings in SETS alternated ("fold glu_words prefetch_MB" each) on
#     the 1B shape (bf16 weights, vocab 128,256), batch 1: fp16 KV at depth 0, int4 KV at 4,096;
#   PART=ncu: per-kernel time and DRAM reads of ~2 decode steps with NCU_SET (the same parser
#     as cuda_step_device.sh), to set beside docs/CUDA.md's "Session 24" table.
# PART=all runs the three. Staged as cuda_graph_device.sh is (prebuilt/, shared-lite/,
# cuda_device_env.sh beside it). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-3}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
has() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
pick='FAILED|PASSED|SKIPPED|Failure|rror|Expected|Which is|tests ran|norms folded'
SETS=${SETS:-"0 8 0;1 8 0;1 4 0;0 8 16;1 8 16;1 4 16"}
NCU_SET=${NCU_SET:-"1 4 16"}
env_of() { set -- $1; echo "PTLLM_CUDA_NORM_FOLD=$1 PTLLM_CUDA_GLU_U=$2 PTLLM_CUDA_L2_PREFETCH=$3"; }
if has tests; then
  echo "== tests as built"
  timeout 400 $B/cuda_backend_test --gtest_color=no 2>&1 | filter | tee "$OUT/tests.txt" | grep -E "$pick"
  echo "== tests, PTLLM_CUDA_NORM_FOLD=1 PTLLM_CUDA_GLU_U=4 PTLLM_CUDA_L2_PREFETCH=16"
  PTLLM_CUDA_NORM_FOLD=1 PTLLM_CUDA_GLU_U=4 PTLLM_CUDA_L2_PREFETCH=16 timeout 400 $B/cuda_backend_test --gtest_color=no \
    2>&1 | filter | tee "$OUT/tests_fold.txt" | grep -E "$pick"
  echo "== perplexity through the cache, stories260K with bf16 weights on the GPU: fold off / on"
  for q in fp16 int4; do
    for f in 0 1; do
      r=$(PTLLM_CUDA_NORM_FOLD=$f timeout 120 $B/posttrainllm perplexity shared-lite/models/stories260K shared-lite/text.txt \
          -w 256 -k 4 --cache-only -q --json --device cuda --device-weights bf16 --kv-quantize $q 2>&1 | tr -d '\n')
      echo "fold=$f $q $r" >> "$OUT/ppl_fold.jsonl"
      echo "fold=$f $q $(echo "$r" | python3 -c "import json,sys; print(repr(json.load(sys.stdin)['results'][0]['through_cache']['ppl']))" 2>/dev/null || echo "$r" | cut -c1-200)"
    done
  done
fi
if { has ab || has ncu; } && [ ! -f /tmp/l1b.gguf ]; then
  $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
fi
if has ab; then
  for round in $(seq "$ROUNDS"); do
    IFS=';' read -ra sets <<< "$SETS"
    for set in "${sets[@]}"; do
      for run in "fp16 0" "int4 4096"; do
        r=$(env $(env_of "$set") timeout 200 $B/posttrainllm bench /tmp/l1b.gguf --device cuda -p 0 \
            --json -d ${run#* } -n 128 -r 3 --kv-quantize ${run% *} 2>&1 | tr -d '\n')
        echo "round $round [$set] $run $r" >> "$OUT/bench_ab.jsonl"
        echo "$r" | show "r$round fold/glu_u/pf_MB [$set] ${run% *} d${run#* }"
      done
    done
  done
fi
if has ncu; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  env $(env_of "$NCU_SET") timeout 300 $NCU --launch-skip 600 --launch-count 200 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,launch__grid_size \
    --csv $B/posttrainllm bench /tmp/l1b.gguf --device cuda -p 0 -n 8 -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "ncu rc $?"; tail -3 "$OUT/ncu.err"
  python3 "$(dirname "$0")/ncu_kernel_table.py" "$OUT/ncu.csv"
fi
