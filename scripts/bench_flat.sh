#!/usr/bin/env bash
# Flat cost of a bounded cache: decode speed after 1,000 and after 100,000
# tokens with StreamingLLM sink 4 + window 252 (issue 8's target: within 10%).
# The fill before each timed decode goes through the cache one token at a time
# once it is full (a StreamingLLM cache takes one token per step), so the
# 100,000 run takes minutes. Usage: scripts/bench_flat.sh [build dir] [threads] [cache flags...]
set -euo pipefail
BUILD=${1:-build-perf}
THREADS=${2:-1}
shift $(( $# > 2 ? 2 : $# )) || true
CACHE=("$@")
BIN="$BUILD/app/posttrainllm"
# One repetition, no warm-up: each repetition re-fills the cache from empty.
for depth in 1000 100000 1000; do
  "$BIN" bench models/flagship-27m -p 0 -n 512 -r 1 --no-warmup --depth "$depth" --threads "$THREADS" \
    --streaming-llm-sink 4 --streaming-llm-window 252 "${CACHE[@]}" --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin)["decode"]; print("depth %6d: %.1f ± %.1f tokens/s, %.1f tokens/CPU-s, cache %d bytes" % (d["depth"], d["tps_mean"], d["tps_sd"], d["tokens_per_cpu_second_mean"], d["cache_bytes_at_end"]))'
done
