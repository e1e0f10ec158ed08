#!/usr/bin/env bash
# Our server against itself: K concurrent streams of TOKENS tokens per level in LEVELS, under
# each server setting in SETTINGS (";"-separated "NAME|FLAGS"), alternated per round and level
# (this VM drifts by tens of percent within minutes); the client is scripts/serve_load_stdlib.py
# (CLIENT=py, least CPU per event) or scripts/serve_load.mjs (CLIENT=node). Prints one line per
# run, then per level and setting the medians of tokens/s and ITL p50 / p99 over the rounds.
#   ROUNDS=3 LEVELS="1 4 16 64" SETTINGS="nice 0|--compute-nice 0;nice 10|--compute-nice 10" \
#     scripts/serve_settings_ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
MODEL=${MODEL:-models/flagship-27m}
ROUNDS=${ROUNDS:-3}; LEVELS=${LEVELS:-"1 4 16 64"}; TOKENS=${TOKENS:-200}; THREADS=${THREADS:-2}
SETTINGS=${SETTINGS:-"nice 0|--compute-nice 0;nice 10|--compute-nice 10"}
CLIENT=${CLIENT:-py}
[ -x "$BIN" ] || { echo "serve_settings_ab: $BIN not built (scripts/setup.sh)" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
run() {  # $1 = name, $2 = flags, $3 = K
  local log="$work/serve.log" url="" pid
  # shellcheck disable=SC2086
  "$BIN" serve "$MODEL" --port 0 --threads "$THREADS" --max-sequences "$3" --max-queue 1024 --kv-budget 4GiB $2 2>"$log" &
  pid=$!
  for _ in $(seq 100); do
    url=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" || true); [ -n "$url" ] && break; sleep 0.1
  done
  [ -n "$url" ] || { echo "serve_settings_ab: server did not start: $(cat "$log")" >&2; exit 1; }
  curl -sf "$url/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":2}' >/dev/null
  if [ "$CLIENT" = node ]; then
    node scripts/serve_load.mjs "$url" --concurrency "$3" --requests "$3" --max-tokens "$TOKENS" | tail -1 |
      python3 -c "
import json, sys; j = json.load(sys.stdin)
print(json.dumps({'setting': '$1', 'k': $3, 'failed': j.get('failed', 0), 'tps': j['tokens_per_second'], 'p50': j['itl_ms_p50'], 'p99': j['itl_ms_p99']}))"
  else
    python3 scripts/serve_load_stdlib.py "$url" "$3" "$TOKENS" | python3 -c "
import json, sys; j = json.load(sys.stdin)
print(json.dumps({'setting': '$1', 'k': $3, 'failed': j['failed'], 'tps': j['events_per_s'], 'p50': j['itl_ms_p50'], 'p99': j['itl_ms_p99']}))"
  fi
  kill -TERM "$pid"; wait "$pid" || true
}
IFS=';' read -ra sets <<< "$SETTINGS"
: > "$work/runs.jsonl"
for r in $(seq "$ROUNDS"); do
  for k in $LEVELS; do
    # The settings' order turns each round, so no setting always runs first.
    n=${#sets[@]}
    for i in $(seq 0 $((n - 1))); do
      IFS='|' read -r name flags <<< "${sets[$(( (i + r) % n ))]}"
      run "$name" "$flags" "$k" | tee -a "$work/runs.jsonl"
    done
  done
done
python3 - "$work/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
print('\n| streams | setting | tok/s | ITL p50 ms | ITL p99 ms (each round) | failed |')
print('| ---: | --- | ---: | ---: | --- | ---: |')
for k in sorted({r['k'] for r in runs}):
    for s in dict.fromkeys(r['setting'] for r in runs):
        v = [r for r in runs if r['k'] == k and r['setting'] == s]
        m = lambda key: statistics.median(x[key] for x in v)
        print('| %d | %s | %.0f | %.2f | %.2f (%s) | %d |' % (k, s, m('tps'), m('p50'), m('p99'),
              ', '.join('%.1f' % x['p99'] for x in v), sum(x['failed'] for x in v)))
PY
