#!/usr/bin/env bash
# Flat cost of a bounded cache (issue 8: time per token after 100,000 generated
# tokens within 10% of the time after 1,000). One `sample` process generates
# TOKENS tokens with StreamingLLM sink 4 + window 252 and prints its decode
# speed every 1,000 tokens; "after 1,000" is the median of the intervals ending
# at 2,000 … 6,000, "after 100,000" the median of the last five intervals
# (medians, because a shared VM has single-interval hiccups).
# Usage: scripts/bench_flat.sh [build dir] [threads] [cache flags...]
# Env: TOKENS (default 100000). For a dedicated machine run with
# OMP_WAIT_POLICY=active (what posttrainllm picks by itself when idle).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
THREADS=${2:-2}
shift $(( $# > 2 ? 2 : $# )) || true
CACHE=("$@")
TOKENS=${TOKENS:-100000}
BIN="$BUILD/app/posttrainllm"
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$BIN" sample models/flagship-27m --prompt "Once upon a time" --tokens "$TOKENS" --ignore-eos --temperature 0.8 \
  --seed 1 --threads "$THREADS" --streaming-llm-sink 4 --streaming-llm-window 252 "${CACHE[@]}" \
  --report-every 1000 --json >/dev/null 2>"$err"
python3 - "$err" "$TOKENS" <<'EOF'
import re, statistics, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("[kv] generated")]
rows = []
for l in lines:
    g = int(re.search(r"generated (\d+)", l).group(1))
    tps = float(re.search(r"decode ([0-9.]+) tok/s", l).group(1))
    stored = int(re.search(r"\(max (\d+)\)", l).group(1))
    kv = int(re.search(r"kv (\d+) bytes", l).group(1))
    anon = int(re.search(r"anon RSS (\d+) KiB", l).group(1))
    rows.append((g, tps, stored, kv, anon))
if len(rows) < 10:
    sys.exit("bench_flat: too few report lines")
early = statistics.median(r[1] for r in rows[1:6])
late = statistics.median(r[1] for r in rows[-5:])
print("tokens/s per 1,000-token interval (every 10th):",
      " ".join("%d:%.0f" % (r[0], r[1]) for r in rows[::10]))
print("after 1,000 (median of intervals to 2k..6k): %.1f tokens/s = %.3f ms/token" % (early, 1000 / early))
print("after %d (median of the last 5 intervals): %.1f tokens/s = %.3f ms/token" % (rows[-1][0], late, 1000 / late))
print("late/early time per token: %.3f (target <= 1.10); max stored %d per layer; kv bytes %d..%d; anon RSS %d..%d KiB"
      % (early / late, max(r[2] for r in rows), min(r[3] for r in rows), max(r[3] for r in rows),
         min(r[4] for r in rows), max(r[4] for r in rows)))
EOF
