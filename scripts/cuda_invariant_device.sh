#!/usr/bin/env bash
# Issue 17, session 29: `--device-batch-invariant` (cuda::EngineOptions::batch_invariant) on the
# GPU. 1. cuda_backend_test's BatchInvariantModeMatchesEachSequenceAlone (bit for bit, alone
# against among 4 and among 20, five cache settings; the default engine's differing rows
# printed), then the whole suite. 2. What the mode costs: `bench` on the 1B shape (random bf16)
# at batch 1, 4, 16 and 64, default and invariant alternated per round. 3. `serve --device cuda`
# on the 1B shape: one greedy request alone, then 24 identical ones at once, default and
# invariant; how many of the 24 texts differ from the alone one. Each part also runs the mode
# with gemv_kernel (PTLLM_CUDA_INVARIANT_TILE=0) and gemv_tile_kernel (=1; written in session
# 29, first run and made the mode's default in session 31: binaries before that need =1).
# 4. (session 31) The KIVI decode kernels after their shared parts moved into helpers
# (turn_queries, slot_scores, slot_values_*, write_split): the KIVI tests with each kernel
# forced, and one layer's decode attention alone, this build's cuda_attn_bench against the
# previous one's (prebuilt/cuda_attn_bench_old, when staged), alternated.
# Staged as the other device scripts are (prebuilt/, shared-lite/, cuda_device_env.sh and
# serve_load_stdlib.py beside it): cd build-stage && bash THIS. PART=tests|bench|serve|kivi: one part.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. ./cuda_device_env.sh
device_preamble
has() { [ -z "${PART:-}" ] || [ "$PART" = "$1" ]; }
ROUNDS=${ROUNDS:-2}
if has tests; then
  echo "== BatchInvariantModeMatchesEachSequenceAlone with PTLLM_CUDA_INVARIANT_TILE=0 (gemv_kernel)"
  PTLLM_CUDA_INVARIANT_TILE=0 timeout 120 $B/cuda_backend_test --gtest_filter='*BatchInvariantMode*' 2>&1 | filter | tail -8
  echo "== the same with PTLLM_CUDA_INVARIANT_TILE=1 (gemv_tile_kernel)"
  PTLLM_CUDA_INVARIANT_TILE=1 timeout 120 $B/cuda_backend_test --gtest_filter='*BatchInvariantMode*' 2>&1 | filter | tail -8
  echo "== all tests"
  timeout 400 $B/cuda_backend_test > "$OUT/all.txt" 2>&1; echo "rc $?"
  grep -E '^\[  (FAILED|PASSED)|tests ran|rows that differ' "$OUT/all.txt" | head -20
fi
if { has bench || has serve; } && [ ! -f /tmp/l1b.gguf ]; then
  timeout 120 $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
fi
if has bench; then
  echo "== bench, 1B shape, bf16 weights, fp16 KV, depth 256: tok/s (all sequences), default against invariant"
  for r in $(seq "$ROUNDS"); do
    for b in 1 4 16 64; do
      for v in default invariant tile; do
        flag=""; [ $v != default ] && flag=--device-batch-invariant
        tile=0; [ $v = tile ] && tile=1
        res=$(PTLLM_CUDA_INVARIANT_TILE=$tile timeout 200 $B/posttrainllm bench /tmp/l1b.gguf --device cuda $flag --kv-quantize fp16 -b $b -d 256 -p 0 \
              -n 64 -r 2 --json 2>&1 | tr -d '\n')
        echo "round $r batch $b $v $res" >> "$OUT/bench.jsonl"
        echo "$res" | python3 -c "
import json,sys; d=json.load(sys.stdin)['decode']; print('round $r  batch %2d  %-9s  tok/s %8.1f' % ($b, '$v', d['tps_mean']))" 2>/dev/null ||
          echo "round $r batch $b $v: $(echo "$res" | cut -c1-300)"
      done
    done
  done
fi
if has serve; then
  start() {  # log, args... -> URL, SPID
    local log=$1; shift
    $B/posttrainllm serve "$@" --port 0 2>"$log" & SPID=$!
    URL=""; for _ in $(seq 600); do URL=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" || true); [ -n "$URL" ] && break; sleep 0.1; done
    [ -n "$URL" ] || { echo "server did not start:"; cat "$log"; }
  }
  REQ='{"prompt":[1,2,3,4,5,6,7,8],"kv_cache":{"quantize":"fp16","sink":4,"window":252}}'
  for v in default invariant tile; do
    flag=""; [ $v != default ] && flag=--device-batch-invariant
    tile=0; [ $v = tile ] && tile=1
    echo "== serve --device cuda $flag (PTLLM_CUDA_INVARIANT_TILE=$tile), 1B shape: 1 alone, then 24 at once (greedy, 96 tokens)"
    export PTLLM_CUDA_INVARIANT_TILE=$tile
    start "$OUT/serve_$v.log" /tmp/l1b.gguf --device cuda $flag --max-sequences 32 --kv-budget 8GiB
    PTLLM_LOAD_TEXTS="$OUT/alone_$v.texts" python3 serve_load_stdlib.py "$URL" 1 96 "$REQ" > "$OUT/alone_$v.json"
    PTLLM_LOAD_TEXTS="$OUT/many_$v.texts" python3 serve_load_stdlib.py "$URL" 24 96 "$REQ" > "$OUT/many_$v.json"
    python3 - "$OUT/alone_$v" "$OUT/many_$v" <<'PY'
import json, sys
(a, at), (m, mt) = ((json.load(open(p + ".json")), json.load(open(p + ".texts"))) for p in sys.argv[1:3])
same = sum(t == at[0] for t in mt) if at and at[0] is not None else "n/a"
print(f"  alone: {a['events_per_s']} tok/s; 24 at once: {m['events_per_s']} tok/s, failed {m['failed']}, "
      f"distinct texts {m['distinct_texts']}, equal to the alone text: {same} of 24")
PY
    kill -TERM $SPID; wait $SPID; echo "  server exit $?"
  done
fi
if has kivi; then
  for v in "PTLLM_CUDA_KIVI_DEC=1" "PTLLM_CUDA_KIVI_DEC=2"; do
    echo "== the KIVI model-level and batch tests with $v"
    env $v timeout 200 $B/cuda_backend_test --gtest_color=no \
      --gtest_filter='*BatchKivi*:*Stories260K*:*Llama*:*Qwen*:*Batch*:*Graph*' 2>&1 | filter |
      grep -E "^\[  (PASSED|FAILED)|tests ran|Failure"
  done
  echo "== decode attention alone (one layer, 8 KV heads x 128, 32 query heads): new and old build alternated"
  for r in $(seq "$ROUNDS"); do
    for bin in cuda_attn_bench cuda_attn_bench_old; do
      [ -x $B/$bin ] || continue
      for v in "PTLLM_CUDA_KIVI_DEC=1" "PTLLM_CUDA_KIVI_DEC=2"; do
        env $v PTLLM_BENCH_MODES=int8,int4,int2 timeout 120 $B/$bin 8192 32768 2>&1 |
          grep decode_attention | sed "s/^/round $r $bin $v /" | tee -a "$OUT/attn.txt"
      done
    done
  done
fi
