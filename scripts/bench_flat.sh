#!/usr/bin/env bash
# Flat cost of a bounded cache (issue 8: time per token after 100,000 generated
# tokens within 10% of the time after 1,000), and the unbounded cache's growth
# for contrast.
#
# 1. `bench --interleave-depths 1000,100000`: two StreamingLLM caches (sink 4 +
#    window 252) in one process, filled untimed to 1,000 and 100,000 tokens,
#    then ROUNDS rounds of GEN timed decode steps on each in turn (alternating
#    cancels the drift of a shared machine). Pass: ratio <= 1.10.
# 2. The same depths schedule 256 … 8192 for the bounded cache and for an
#    unbounded one (speed only past flagship-27m's 512-token context).
#
# Usage: scripts/bench_flat.sh [build dir] [threads] [cache flags...]
# Env: GEN (default 256), ROUNDS (default 8), DEEP (default 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-2}
shift $(( $# > 2 ? 2 : $# )) || true
CACHE=("$@")
BIN="$BUILD/app/posttrainllm"
GEN=${GEN:-256}
ROUNDS=${ROUNDS:-8}
DEEP=${DEEP:-100000}
M=models/flagship-27m
echo "## 1,000 vs $DEEP generated tokens, sink 4 + window 252 ${CACHE[*]}"
out=$("$BIN" bench $M -p 0 -n "$GEN" -r "$ROUNDS" --threads "$THREADS" --interleave-depths "1000,$DEEP" \
  --streaming-llm-sink 4 --streaming-llm-window 252 "${CACHE[@]}")
echo "$out"
ratio=$(echo "$out" | sed -n 's/^time per token at .*: \([0-9.]*\)$/\1/p')
if awk -v r="$ratio" 'BEGIN { exit !(r <= 1.10) }'; then echo "flat: PASS ($ratio <= 1.10)"; else echo "flat: FAIL ($ratio > 1.10)"; fi
if [ "${CURVES:-1}" = 1 ]; then
  echo "## decode speed against stored tokens: bounded (sink 4 + window 252) vs unbounded"
  "$BIN" bench $M -p 0 -n 64 -r 3 --threads "$THREADS" --interleave-depths 256,1024,2048,4096,8192 \
    --streaming-llm-sink 4 --streaming-llm-window 252 "${CACHE[@]}" | grep -E '^\| tg|^time'
  "$BIN" bench $M -p 0 -n 64 -r 3 --threads "$THREADS" --interleave-depths 256,1024,2048,4096,8192 "${CACHE[@]}" |
    grep -E '^\| tg|^time'
fi
