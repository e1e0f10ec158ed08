#!/usr/bin/env bash
# Soak: `posttrainllm serve` under C concurrent streams (default 16) for S seconds
# (default 600), new requests started back to back. Samples the server's VmRSS
# every 10 s and checks: no failed request, server exit 0, and RSS flat: the largest
# sample (the high-water mark) of the last third of the run not above that of the
# middle third by more than SLACK_MIB (default 4). The server makes its caches
# resident in full at start-up and at admission and keeps freed ones in its heap
# for the next request (cmd_serve.cc), so RSS reaches its level in the first wave
# and stays; a leak lifts it by SLACK_MIB per third of the run and fails the check.
# (Sessions 6-7 ran a server that returned caches to the OS and faulted pages in
# as rows arrived: RSS then swung by ~65 MiB with the rows in use, and this rule,
# the same then, failed on one sample of the swing; docs/RELIABILITY.md.)
#   SECONDS_TOTAL=600 CONCURRENCY=16 [RSS_OUT=FILE] scripts/serve_soak.sh [extra serve flags]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/serve_url.sh
BIN=${BIN:-build/app/posttrainllm}
S=${SECONDS_TOTAL:-600}
C=${CONCURRENCY:-16}
SLACK_MIB=${SLACK_MIB:-4}
THREADS=${THREADS:-2}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
# --http-threads C + 8: each HTTP thread keeps about 1 MiB of its own (stack, heap
# arena) once it has served a request, so with the default pool (96 threads) RSS
# climbs for the first few hundred requests while the pool warms up; a pool sized to
# the load warms up in the first wave and the flatness check measures leaks only.
"$BIN" serve --port 0 --threads "$THREADS" --max-sequences "$C" --http-threads $((C + 8)) "$@" 2>"$work/serve.log" &
pid=$!
url=$(serve_url "$work/serve.log" serve_soak) || exit 1
( t=0; while kill -0 "$pid" 2>/dev/null; do
    echo "$t $(awk '/VmRSS|RssAnon/ {printf "%s ", $2}' /proc/$pid/status)" >>"$work/rss.txt"; sleep 10; t=$((t + 10)); done ) &
node scripts/serve_load.mjs "$url" --concurrency "$C" --requests 100000000 --max-tokens 200 --seconds "$S" | tee "$work/load.json"
kill -TERM "$pid"; wait "$pid"; rc=$?
[ -n "${RSS_OUT:-}" ] && cp "$work/rss.txt" "$RSS_OUT"  # t s, VmRSS kB, RssAnon kB every 10 s
python3 - "$work/rss.txt" "$work/load.json" "$SLACK_MIB" "$rc" "$S" <<'PY'
import json, sys
rss = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 3]  # t, VmRSS kB, RssAnon kB
load = json.load(open(sys.argv[2]))
slack, rc, total = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
third = max(60, total // 3)
mid = [r for r in rss if third <= r[0] < 2 * third]
last = [r for r in rss if r[0] >= 2 * third]
if not mid or not last:
    print("serve_soak: too few RSS samples for the run's thirds"); sys.exit(1)
mib = lambda rows, i, f: f(r[i] for r in rows) / 1024
mid_max, mid_min, last_max, last_min = mib(mid, 1, max), mib(mid, 1, min), mib(last, 1, max), mib(last, 1, min)
print(f"requests {load['requests_done']}, failed {load['failed']}, generated {load['generated_tokens']} tokens in {load['seconds']} s "
      f"({load['tokens_per_second']} tokens/s); VmRSS middle third {mid_min:.1f}..{mid_max:.1f} MiB, last third "
      f"{last_min:.1f}..{last_max:.1f} MiB (anonymous max {mib(mid, 2, max):.1f} -> {mib(last, 2, max):.1f}; "
      f"first sample {rss[0][1] / 1024:.1f}, last {rss[-1][1] / 1024:.1f}); server exit {rc}")
ok = load['failed'] == 0 and last_max - mid_max <= slack and rc == 0
print("serve_soak:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
