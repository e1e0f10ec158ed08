#!/usr/bin/env bash
# Throughput and latency of `posttrainllm serve` vs llama.cpp, side by side in
# one run, alternated per round and per level (this VM drifts by tens of percent
# within minutes): K concurrent streams of T tokens each, K in LEVELS.
#   ours:      serve (--threads 2, --max-sequences K) driven by scripts/serve_load.mjs
#   llama.cpp: node-llama-cpp, K sequences of one context (scripts/llamacpp_streams.mjs)
# on the same model (flagship-27m; llama.cpp reads it as an f16 GGUF written by
# our converter, the same weights). Prints each run as a JSON line, then a
# markdown table of the per-level medians over the rounds.
#   ROUNDS=3 LEVELS="1 4 16 64" TOKENS=200 scripts/serve_vs_llamacpp.sh
# LIGHT_CLIENT=1: the same server is then driven once more by scripts/serve_load_stdlib.py
# (Python's standard library, one thread per stream: less CPU per event than Node on the two
# cores the server uses) and its inter-token p50 / p99 get a column of their own, to tell
# the server's latency from what the Node client's own CPU use adds to it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/serve_url.sh
BIN=${BIN:-build/app/posttrainllm}
ROUNDS=${ROUNDS:-3}
LEVELS=${LEVELS:-"1 4 16 64"}
TOKENS=${TOKENS:-200}
THREADS=${THREADS:-2}
MODEL=${MODEL:-models/flagship-27m}
OURS_CACHE=${OURS_CACHE:-}      # extra serve flags, e.g. "--kv-quantize int4"
LLAMA_KV=${LLAMA_KV:-f16}
CLIENT_WARMUP=${CLIENT_WARMUP:-16}  # tokens of serve_load.mjs's untimed warm-up request; 0: the Node client starts up
# (JIT, first fetch) while its timed prompts are prefilled, which took the time to first token from
# 15-28 to 110-320 ms at 4 streams (docs/SERVER.md, "Session 29"). llama.cpp's side warms up too.
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
[ -x "$BIN" ] || { echo "serve_vs_llamacpp: $BIN not built (scripts/setup.sh)" >&2; exit 2; }
GGUF=${GGUF:-$work/flagship-f16.gguf}
[ -f "$GGUF" ] || "$BIN" convert "$MODEL" "$GGUF" --type f16 >/dev/null

ours() {  # $1 = K
  local log="$work/serve.log"
  # shellcheck disable=SC2086
  "$BIN" serve "$MODEL" --port 0 --threads "$THREADS" --max-sequences "$1" --max-queue 1024 \
    --kv-budget 4GiB $OURS_CACHE 2>"$log" &
  local pid=$!
  local url
  url=$(serve_url "$log" serve_vs_llamacpp) || exit 1
  # Warm-up outside the timing (weights faulted in), as llamacpp_streams.mjs does.
  curl -sf "$url/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":2}' >/dev/null
  # --warmup: the Node client's own start-up (module loading, JIT) done before its timed streams.
  node scripts/serve_load.mjs "$url" --concurrency "$1" --requests "$1" --max-tokens "$TOKENS" --warmup "$CLIENT_WARMUP" |
    sed 's/^{/{"engine":"posttrainllm serve",/'
  if [ "${LIGHT_CLIENT:-0}" = 1 ]; then
    python3 scripts/serve_load_stdlib.py "$url" "$1" "$TOKENS" | python3 -c '
import json, sys
j = json.load(sys.stdin)
print(json.dumps({"engine": "posttrainllm serve, stdlib client", "concurrency": j["requests"], "failed": j["failed"],
                  "tokens_per_second": j["events_per_s"], "itl_ms_p50": j["itl_ms_p50"], "itl_ms_p99": j["itl_ms_p99"]}))'
  fi
  kill -TERM "$pid"; wait "$pid" || true
}
# node-llama-cpp refuses a context it estimates too large for the RAM (64
# sequences on this 24 GiB VM): record that and go on with the other runs.
theirs() {
  node scripts/llamacpp_streams.mjs "$GGUF" --streams "$1" --tokens "$TOKENS" --threads "$THREADS" --kv-type "$LLAMA_KV" ||
    echo "{\"engine\":\"llama.cpp\",\"streams\":$1,\"failed_to_run\":true}"
}

: >"$work/runs.jsonl"
for r in $(seq "$ROUNDS"); do
  for k in $LEVELS; do
    # Alternate which engine goes first from round to round.
    if [ $((r % 2)) -eq 1 ]; then ours "$k"; theirs "$k"; else theirs "$k"; ours "$k"; fi | tee -a "$work/runs.jsonl"
  done
done
python3 - "$work/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
OURS, LIGHT = 'posttrainllm serve', 'posttrainllm serve, stdlib client'
def med(eng, k, key):
    v = [r[key] for r in runs if (r['engine'] == eng or (eng == 'llama.cpp' and r['engine'].startswith(eng)))
         and (r.get('concurrency') or r.get('streams')) == k and r.get(key) is not None]
    return statistics.median(v) if v else float('nan')
levels = sorted({r.get('concurrency') or r.get('streams') for r in runs})
light = any(r['engine'] == LIGHT for r in runs)
print('\n| streams | ours tok/s | llama.cpp tok/s | ratio | ours TTFT p50 ms | llama.cpp TTFT p50 ms | ours ITL p50 / p99 ms | llama.cpp ITL p50 / p99 ms |'
      + (' ours, stdlib client: tok/s, ITL p50 / p99 ms |' if light else ''))
print('| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |' + (' ---: |' if light else ''))
for k in levels:
    o, t = med(OURS, k, 'tokens_per_second'), med('llama.cpp', k, 'tokens_per_second')
    print(f"| {k} | {o:.0f} | {t:.0f} | {o / t:.2f} | {med(OURS, k, 'ttft_ms_p50'):.1f} | {med('llama.cpp', k, 'ttft_ms_p50'):.1f} | "
          f"{med(OURS, k, 'itl_ms_p50'):.1f} / {med(OURS, k, 'itl_ms_p99'):.1f} | "
          f"{med('llama.cpp', k, 'itl_ms_p50'):.1f} / {med('llama.cpp', k, 'itl_ms_p99'):.1f} |"
          + (f" {med(LIGHT, k, 'tokens_per_second'):.0f}, {med(LIGHT, k, 'itl_ms_p50'):.1f} / {med(LIGHT, k, 'itl_ms_p99'):.1f} |"
             if light else ''))
EOF
