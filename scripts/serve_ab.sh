#!/usr/bin/env bash
# Our server against itself: variants of `posttrainllm serve` (environment settings or
# flags) alternated per round and level, since this VM drifts by tens of percent within
# minutes; the variants' order turns each round, so none always runs first. Each variant
# is NAME:ASSIGNMENTS (comma-separated VAR=VALUE, or "-" for none; BIN=PATH: that binary
# instead of $BIN, e.g. a build of the previous commit; ARG=--flag=value: a serve flag;
# THREADS=N: that --threads instead of $THREADS).
# Each run is K concurrent streams of TOKENS tokens after a warm-up request, from
# scripts/serve_load.mjs (which first sends an untimed request of its own, CLIENT_WARMUP
# tokens, so that its start-up is over), or with CLIENT=py from scripts/serve_load_stdlib.py
# (less CPU per event on the two cores the server uses; no time to first token). Prints one JSON line per
# run, then the medians per level and variant: tokens/s, client and server time to first
# token, inter-token p50 / p99 (and each run's p99).
#   VARIANTS="stepped:PTLLM_SERVE_PROMPTS=stepped together:-" ROUNDS=3 LEVELS="1 16" \
#     TOKENS=50 scripts/serve_ab.sh
#   CLIENT=py VARIANTS="nice0:ARG=--compute-nice=0 nice10:ARG=--compute-nice=10" ROUNDS=4 \
#     LEVELS="1 4" TOKENS=200 scripts/serve_ab.sh
# PREFILL=N instead: N requests one after another (curl, max_tokens 1, PROMPT), and
# the server's own time to admit and prefill each (PTLLM_SERVE_TRACE's second column,
# the warm-up's step left out): its median and minimum per run, in microseconds.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/serve_url.sh
BIN=${BIN:-build/app/posttrainllm}
MODEL=${MODEL:-models/flagship-27m}
ROUNDS=${ROUNDS:-3}
LEVELS=${LEVELS:-"1 16"}
TOKENS=${TOKENS:-50}
THREADS=${THREADS:-2}
PREFILL=${PREFILL:-0}
PROMPT=${PROMPT:-Once upon a time there was a little girl}
CLIENT=${CLIENT:-node}
CLIENT_WARMUP=${CLIENT_WARMUP:-16}  # serve_load.mjs --warmup: the Node client's start-up before its timed streams (as serve_vs_llamacpp.sh)
VARIANTS=${VARIANTS:?"VARIANTS=\"NAME:VAR=VALUE,... NAME:- ...\""}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
[ -x "$BIN" ] || { echo "serve_ab: $BIN not built (scripts/setup.sh)" >&2; exit 2; }

run() {  # $1 = name, $2 = assignments, $3 = K
  local log="$work/serve.log" url="" envs=() flags=() a=() bin=$BIN threads=$THREADS
  [ "$2" != - ] && IFS=, read -ra a <<<"$2"
  for x in "${a[@]}"; do
    case $x in BIN=*) bin=${x#BIN=} ;; THREADS=*) threads=${x#THREADS=} ;; ARG=*) flags+=("${x#ARG=}") ;; *) envs+=("$x") ;; esac
  done
  env "${envs[@]}" PTLLM_SERVE_TRACE="$work/trace.txt" "$bin" serve "$MODEL" --port 0 --threads "$threads" --max-sequences "$3" --max-queue 1024 \
    --kv-budget 4GiB "${flags[@]}" 2>"$log" &
  local pid=$!
  url=$(serve_url "$log" serve_ab) || exit 1
  curl -sf "$url/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":2}' >/dev/null
  if [ "$PREFILL" -gt 0 ]; then
    local body
    body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 1}))' "$PROMPT")
    sleep 0.2; : >"$work/trace.txt"
    for _ in $(seq "$PREFILL"); do curl -sf "$url/v1/completions" -d "$body" >/dev/null; done
    python3 - "$work/trace.txt" "$1" <<'PY'
import json, statistics, sys
us = [int(l.split()[1]) for l in open(sys.argv[1]) if l[:1].isdigit() and int(l.split()[1]) > 0]
print(json.dumps({"variant": sys.argv[2], "streams": 1, "requests": len(us),
                  "prefill_us_p50": statistics.median(us), "prefill_us_min": min(us)}))
PY
    kill -TERM "$pid"; wait "$pid" || true
    return
  fi
  if [ "$CLIENT" = py ]; then
    python3 scripts/serve_load_stdlib.py "$url" "$3" "$TOKENS" | python3 -c "
import json, sys; j = json.load(sys.stdin)
print(json.dumps({'variant': '$1', 'streams': $3, 'failed': j['failed'], 'tokens_per_second': j['events_per_s'],
                  'itl_ms_p50': j['itl_ms_p50'], 'itl_ms_p99': j['itl_ms_p99']}))"
  else
    node scripts/serve_load.mjs "$url" --concurrency "$3" --requests "$3" --max-tokens "$TOKENS" --warmup "$CLIENT_WARMUP" |
      sed "s/^{/{\"variant\":\"$1\",\"streams\":$3,/"
  fi
  kill -TERM "$pid"; wait "$pid" || true
}

: >"$work/runs.jsonl"
read -ra vs <<<"$VARIANTS"
for r in $(seq "$ROUNDS"); do
  for k in $LEVELS; do
    for i in "${!vs[@]}"; do
      v=${vs[$(( (i + r - 1) % ${#vs[@]} ))]}
      run "${v%%:*}" "${v#*:}" "$k"
    done | tee -a "$work/runs.jsonl"
  done
done
python3 - "$work/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
if runs and 'prefill_us_p50' in runs[0]:
    print('| variant | runs | admit + prefill p50 us (median of runs) | min us |')
    print('| --- | ---: | ---: | ---: |')
    for v in dict.fromkeys(r['variant'] for r in runs):
        rs = [r for r in runs if r['variant'] == v]
        print(f"| {v} | {len(rs)} | {statistics.median(r['prefill_us_p50'] for r in rs):.0f} | "
              f"{min(r['prefill_us_min'] for r in rs)} |")
    sys.exit(0)
print('| streams | variant | runs | tokens/s | TTFT p50 ms, client | TTFT mean ms, server | ITL p50 / p99 ms (each run\'s p99) | failed |')
print('| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |')
for k in sorted({r['streams'] for r in runs}):
    for v in dict.fromkeys(r['variant'] for r in runs):
        rs = [r for r in runs if r['streams'] == k and r['variant'] == v]
        if not rs: continue
        def m(f):  # the py client reports no time to first token
            xs = [r[f] for r in rs if r.get(f) is not None]
            return statistics.median(xs) if xs else float('nan')
        each = ', '.join('%.1f' % r['itl_ms_p99'] for r in rs)
        print(f"| {k} | {v} | {len(rs)} | {m('tokens_per_second'):.0f} | {m('ttft_ms_p50'):.1f} | "
              f"{m('server_ttft_ms_mean'):.1f} | {m('itl_ms_p50'):.2f} / {m('itl_ms_p99'):.1f} ({each}) | "
              f"{sum(r.get('failed', 0) for r in rs)} |")
PY
