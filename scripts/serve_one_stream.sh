#!/usr/bin/env bash
# One stream's inter-token latency, the client's and the server's own decode steps side by
# side, per server setting and per client, alternated (docs/SERVER.md, "Session 25"):
#   per round, per server setting in SETTINGS (";"-separated, each "NAME|ENV|FLAGS"), one
#   `posttrainllm serve` with PTLLM_SERVE_TRACE, a 50-token warm-up, then per client in
#   CLIENTS (node = scripts/serve_load.mjs with --warmup NODE_WARMUP, "node0" the same with no
#   warm-up, py = scripts/serve_load_stdlib.py) one streamed
#   request of TOKENS tokens; prints the client's ITL p50 / p99 and, from the trace lines
#   between that client's timed start (after its warm-up) and its end, the server's
#   decode-step p50 / p99 / max and how
#   many steps took over SLOW_MS (default 2.2: llama-server's recorded one-stream p99), and the
#   client's gaps grouped by how many server steps each spans (serve_trace_report.py).
#   ROUNDS=3 TOKENS=200 scripts/serve_one_stream.sh
#   SETTINGS="default||--threads 2;passive|OMP_WAIT_POLICY=passive|--threads 2;one thread||--threads 1" \
#     CLIENTS=py scripts/serve_one_stream.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/serve_url.sh
BIN=${BIN:-build/app/posttrainllm}
MODEL=${MODEL:-models/flagship-27m}
ROUNDS=${ROUNDS:-3}; TOKENS=${TOKENS:-200}; SLOW_MS=${SLOW_MS:-2.2}
SETTINGS=${SETTINGS:-"default||--threads 2"}
CLIENTS=${CLIENTS:-"node py"}
NODE_WARMUP=${NODE_WARMUP:-16}  # serve_load.mjs --warmup (0: the client's start-up overlaps the timed stream)
[ -x "$BIN" ] || { echo "serve_one_stream: $BIN not built (scripts/setup.sh)" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mono_us() { python3 -c 'import time; print(time.monotonic_ns() // 1000)'; }
# The trace's decode column (us) for steps that started in [$1, $2).
steps() {
  python3 - "$work/trace.txt" "$1" "$2" "$SLOW_MS" <<'EOF'
import sys
path, a, b, slow = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) * 1e3
d = sorted(int(l.split()[2]) for l in open(path) if l.strip() and a <= int(l.split()[0]) < b)
q = lambda p: d[min(len(d) - 1, int(p * len(d)))] / 1e3 if d else float('nan')
print("server steps %d: p50 %.2f p99 %.2f max %.2f ms, %d over %.1f ms"
      % (len(d), q(0.5), q(0.99), d[-1] / 1e3 if d else float('nan'), sum(x > slow for x in d), slow / 1e3))
EOF
}
# client C URL: one line "tok/s T, ITL p50 X p99 Y ms"; the Node client's timed start (after its
# warm-up) into $work/from_us.
client() {
  if [ "$1" = node ] || [ "$1" = node0 ]; then
    local w=$NODE_WARMUP; [ "$1" = node0 ] && w=0
    node scripts/serve_load.mjs "$2" --concurrency 1 --requests 1 --max-tokens "$TOKENS" --warmup "$w" | tail -1 |
      python3 -c "
import json, sys
j = json.load(sys.stdin)
open('$work/from_us', 'w').write(str(j['timed_from_us']))
print('tok/s %.0f, ITL p50 %.2f p99 %.2f ms' % (j['tokens_per_second'], j['itl_ms_p50'], j['itl_ms_p99']))"
  else
    python3 scripts/serve_load_stdlib.py "$2" 1 "$TOKENS" |
      python3 -c "import json,sys; j=json.load(sys.stdin); print('tok/s %.0f, ITL p50 %.2f p99 %.2f ms' % (j['events_per_s'], j['itl_ms_p50'], j['itl_ms_p99']))"
  fi
}
IFS=';' read -ra sets <<< "$SETTINGS"
for r in $(seq "$ROUNDS"); do
  for s in "${sets[@]}"; do
    IFS='|' read -r name envs flags <<< "$s"
    : > "$work/trace.txt"
    # shellcheck disable=SC2086
    env $envs PTLLM_SERVE_TRACE="$work/trace.txt" "$BIN" serve "$MODEL" --port 0 --max-sequences 4 $flags \
      2> "$work/serve.log" &
    pid=$!
    url=$(serve_url "$work/serve.log" serve_one_stream) || exit 1
    python3 scripts/serve_load_stdlib.py "$url" 1 50 > /dev/null  # warm-up, untimed
    for c in $CLIENTS; do
      t0=$(mono_us); echo "$t0" > "$work/from_us"
      line=$(PTLLM_LOAD_TRACE="$work/client.txt" client "$c" "$url"); t1=$(mono_us); t0=$(cat "$work/from_us")
      # The client's gaps by the server steps each spans (scripts/serve_trace_report.py): one
      # step is the step and its delivery; several, text held back until a character completes.
      spans=$(python3 scripts/serve_trace_report.py "$work/trace.txt" "$work/client.txt" | python3 -c '
import re, sys
out = []
for l in sys.stdin:
    m = re.match(r"gaps over (\S+) steps?\s*:\s*(\d+)\s+p50\s+\S+\s+p99\s+(\S+)\s+max\s+(\S+)", l)
    if m and m.group(1) != "0":
        out.append("%s-step gaps %s (p99 %s, max %s ms)" % (m.group(1), m.group(2), m.group(3), m.group(4)))
print("; ".join(out))')
      echo "round $r, server $name, client $c: $line; $(steps "$t0" "$t1"); $spans"
    done
    kill -TERM "$pid"; wait "$pid" || true
  done
done
