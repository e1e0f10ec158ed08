#!/usr/bin/env bash
# Regenerates the tables of docs/EVALUATION.md (sections "Perplexity ...",
# "Long streams", "Greedy match"). Each command is printed, then its markdown
# output. Usage: scripts/eval_tables.sh [SECTION...]   (default: all)
#   sections: flagship-window flagship-window-kv flagship-stream flagship-8k
#             flagship-8k-kivi flagship-compare flagship-compare-long
#             flagship-bytes stories-window stories-stream stories-compare
#             stories-compare-long stories-bytes
#             long-window long-rotation long-stream long-200k   (flagship-long-31m, issue 16)
# Env: BIN (default build/app/posttrainllm), THREADS (default 2), CORPUS
# (default corpus/heldout or ../shared/corpus/heldout), N (stream tokens, 4096); long-rotation:
# ROT_WINDOW (4096), ROT_WINDOWS (1); long-stream: LONG_STREAM_QW (1020);
# long-200k: TWICE_PARALLEL=1 runs its two runs at once.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
THREADS=${THREADS:-2}
N=${N:-4096}
CORPUS=${CORPUS:-}
if [ -z "$CORPUS" ]; then
  for d in corpus/heldout ../shared/corpus/heldout; do [ -d "$d" ] && CORPUS=$d && break; done
fi
[ -n "$CORPUS" ] || { echo "error: no corpus/heldout (set CORPUS=...)" >&2; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mapfile -t BOOKS < <(ls "$CORPUS"/*.txt | LC_ALL=C sort)
FLAG=models/flagship-27m
LONG=models/flagship-long-31m
STORIES=models/stories260K
STREAM_CONFIGS=(--streaming-llm-sink 0,0,4,4 --streaming-llm-window 0,256,252,508)

show() {
  local shown="posttrainllm ${*:2}"
  shown=${shown//"${BOOKS[*]}"/"$CORPUS/*.txt"}
  printf '\n```\n%s\n```\n\n' "$shown"
}
run() {
  show "$@"
  local t0=$SECONDS
  "$@" --threads "$THREADS" -q
  echo "($((SECONDS - t0)) s wall, --threads $THREADS)"
}

KV_ALL=fp32,fp16,bf16,int8,int4,int2
# Grouped (default G 32, R 128) and the simple scheme (group 0) side by side;
# --kivi-group pairs with --kivi-residual, plain modes run once.
SCHEMES=(--kivi-group 32,0 --kivi-residual 128,0)

# Sections that run the same way on both models (MODEL, plus the plot file or lengths).
# perplexity ARGS --json twice (runs a and b): each run's summary, then exit 1
# unless both give the same mean NLL bit for bit. TAG names the files
# /tmp/eval_twice_TAG_{a,b}.json.
twice() {  # TAG ARGS...
  local tag=$1 r
  shift
  # The two runs are independent processes; TWICE_PARALLEL=1 runs them at the
  # same time (one core each with THREADS=1), which halves the wall time.
  # Run b writes its plot under /tmp, so two runs never write one file.
  local pids=() args=("$@") i
  for r in a b; do
    show "$BIN" perplexity "${args[@]}" --json
    if [ "${TWICE_PARALLEL:-0}" = 1 ]; then
      "$BIN" perplexity "${args[@]}" --json --threads "$THREADS" -q > /tmp/eval_twice_${tag}_$r.json &
      pids+=($!)
    else
      "$BIN" perplexity "${args[@]}" --json --threads "$THREADS" -q > /tmp/eval_twice_${tag}_$r.json
    fi
    for i in "${!args[@]}"; do
      if [ "${args[$i]}" = --plot ]; then args[$((i + 1))]=/tmp/eval_twice_${tag}_b.svg; fi
    done
  done
  for p in "${pids[@]}"; do wait "$p"; done
  for r in a b; do
    jq -c '.results[0].through_cache | {ppl, predictions, max_stored_tokens, max_cache_bytes, tokens_per_second}' \
      /tmp/eval_twice_${tag}_$r.json
  done
  if jq -e -n --slurpfile a /tmp/eval_twice_${tag}_a.json --slurpfile b /tmp/eval_twice_${tag}_b.json \
       '$a[0].results[0].through_cache.mean_nll == $b[0].results[0].through_cache.mean_nll' >/dev/null; then
    echo "deterministic: both runs give the same mean NLL bit for bit"
  else
    echo "NOT deterministic" && exit 1
  fi
}
streams() {
  run "$BIN" perplexity "$1" "${BOOKS[@]}" --stream "$N" "${STREAM_CONFIGS[@]}" --kv-quantize fp32,int8,int4 --plot "$2"
  run "$BIN" perplexity "$1" "${BOOKS[@]}" --stream "$N" --streaming-llm-sink 4 --streaming-llm-window 252 \
    --streaming-llm-rope absolute --kv-quantize fp32,int8,int4
}
compare60() {
  run "$BIN" compare "$1" --prompts scripts/eval_prompts.txt --tokens 60 --kv-quantize fp16,bf16,int8,int4,int2 \
    "${SCHEMES[@]}"
}
# Longer generations, and a 32-token residual: with the default R 128 a
# 60-token generation never leaves the fp32 residual.
compare300() {
  run "$BIN" compare "$1" --prompts scripts/eval_prompts.txt --tokens 300 --kv-quantize fp16,bf16,int8,int4,int2 \
    --kivi-group 32,32,0 --kivi-residual 128,32,0
}
bytes() {
  for sch in "" "--kivi-group 0"; do
    show "$BIN" cache-table "$1" --lengths "$2" $sch
    "$BIN" cache-table "$1" --lengths "$2" $sch
  done
}

section() {
  case $1 in
    flagship-window) run "$BIN" perplexity $FLAG "${BOOKS[@]}" --window 512 --max-windows 64 --through-cache ;;
    flagship-window-kv)
      run "$BIN" perplexity $FLAG "${BOOKS[@]}" --window 512 --max-windows "${KV_WINDOWS:-64}" --cache-only \
        --kv-quantize $KV_ALL "${SCHEMES[@]}"
      run "$BIN" perplexity $FLAG "${BOOKS[@]}" --window 512 --max-windows "${KV_WINDOWS:-64}" --cache-only \
        --kv-quantize-k int4,int8 --kv-quantize-v int2,int4 ;;
    flagship-stream) streams $FLAG docs/eval_stream_flagship.svg ;;
    flagship-8k)
      # Twice, to show the result is deterministic; memory stays flat (max stored <= sink + window).
      twice 8k $FLAG "${BOOKS[1]}" --stream 8192 --streaming-llm-sink 4 --streaming-llm-window 252 ;;
    flagship-8k-kivi)
      # Issue 6: 8,192 tokens of each book, sink 4 + window 252, reposition; grouped vs simple KIVI.
      run "$BIN" perplexity $FLAG "${BOOKS[@]}" --stream 8192 --streaming-llm-sink 4 --streaming-llm-window 252 \
        --kv-quantize fp32,int8,int4,int2 "${SCHEMES[@]}" ;;
    flagship-compare) compare60 $FLAG ;;
    flagship-compare-long) compare300 $FLAG ;;
    flagship-bytes) bytes $FLAG 256,512,1024,4096,8192 ;;
    stories-window)
      run "$BIN" perplexity $STORIES "${BOOKS[@]}" --window 512 --max-windows 64 --through-cache \
        --kv-quantize $KV_ALL "${SCHEMES[@]}" ;;
    stories-stream) streams $STORIES docs/eval_stream_stories.svg ;;
    stories-compare) compare60 $STORIES ;;
    stories-compare-long) compare300 $STORIES ;;
    stories-bytes) bytes $STORIES 256,512,4096 ;;
    long-window)
      # 16 windows of 4,096 through the cache, each setting against the fp32 cache in lockstep.
      run "$BIN" perplexity $LONG "${BOOKS[@]}" --window 4096 --max-windows 16 --cache-only \
        --kv-quantize fp32,int8,int4,int3,int2 --kl-divergence ;;
    long-rotation)
      # KIVI per-channel K vs rotated per-channel vs rotated per-token (and per-token unrotated).
      run "$BIN" perplexity $LONG "${BOOKS[@]}" --window "${ROT_WINDOW:-4096}" --max-windows "${ROT_WINDOWS:-1}" --cache-only \
        --kv-quantize int4,int3,int2 --kv-rotate none,hadamard --kivi-k-axis channel,token --kl-divergence ;;
    long-stream)
      # Each book's first 4,096 tokens: dense vs sink 4 + window 252 ... 2,044 inside the training context.
      # fp32 at every window, then int4/int2 at window 1,020 only (LONG_STREAM_QW=0,252,508,1020,2044 for all;
      # the sink list follows: 0 for a window of 0, else 4).
      run "$BIN" perplexity $LONG "${BOOKS[@]}" --stream 4096 --streaming-llm-sink 0,4,4,4,4 \
        --streaming-llm-window 0,252,508,1020,2044 --kv-quantize fp32 --plot docs/eval_stream_long.svg
      local qw=${LONG_STREAM_QW:-1020} qs
      qs=$(tr ',' '\n' <<<"$qw" | sed 's/^0$/x/;s/^[0-9][0-9]*$/4/;s/^x$/0/' | paste -sd,)
      run "$BIN" perplexity $LONG "${BOOKS[@]}" --stream 4096 --streaming-llm-sink "$qs" \
        --streaming-llm-window "$qw" --kv-quantize int4,int2 --plot docs/eval_stream_long_q.svg ;;
    long-200k)
      # The books end to end as one input, 200,000 tokens, sink 4 + window 1,020, int4; twice (determinism).
      local all=/tmp/eval_long_books.txt
      cat "${BOOKS[@]}" > "$all"
      twice 200k $LONG "$all" --stream 200000 --streaming-llm-sink 4 --streaming-llm-window 1020 \
        --kv-quantize int4 --plot docs/eval_stream_long_200k.svg --plot-bin 1024
      jq -r '.results[0].through_cache.segments[]? | "\(.first)-\(.last): ppl \(.ppl) (\(.predictions) predictions)"' /tmp/eval_twice_200k_a.json || true ;;
    *) echo "unknown section $1" >&2; exit 1 ;;
  esac
}

if [ $# -eq 0 ]; then
  set -- flagship-window flagship-window-kv flagship-stream flagship-8k flagship-8k-kivi flagship-compare \
    flagship-compare-long flagship-bytes stories-window stories-stream stories-compare stories-compare-long stories-bytes
fi
for s in "$@"; do section "$s"; done
