#!/usr/bin/env bash
# Old binary vs new binary, alternated in one run (issue 13: "speed unchanged or
# better"). For each round and each line, OLD then NEW run the same `bench`
# command back to back, so machine drift hits both alike; the median over
# rounds is reported with the ratio new/old.
# Lines: bench -p 512 -n 128 (prefill and decode from an empty cache) for
# fp32/int8/int4, and decode with 4,096 stored tokens (full StreamingLLM cache
# sink 4 + window 4092, as scripts/kivi_bench.sh) for the same modes.
# Usage: scripts/ab_bench.sh OLD_BIN NEW_BIN   Env: ROUNDS (5), THREADS (2), MODES,
#        RAW (keep every round's figures in this file), MODEL (models/flagship-27m;
#        any file or folder `bench` loads), ARGS (instead of those lines, one line
#        of these bench arguments without -r, e.g. ARGS="-p 0 -n 32" for a 1B GGUF's decode).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$1 NEW=$2
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
MODES=(${MODES:-fp32 int8 int4})
MODEL=${MODEL:-models/flagship-27m}
ARGS=${ARGS:-}
res=${RAW:-$(mktemp)}
[ -n "${RAW:-}" ] || trap 'rm -f "$res"' EXIT
: >"$res"
run() {  # tag bin line args...
  local tag=$1 bin=$2 line=$3; shift 3
  "$bin" bench "$MODEL" --threads "$THREADS" -r 1 --json "$@" |
    python3 -c 'import json,sys; d=json.load(sys.stdin)
for k in ("prefill","decode"):
    if d.get(k) and d[k].get("tokens"): print(sys.argv[1], sys.argv[2]+"/"+k, d[k]["tps_mean"])' "$tag" "$line" >>"$res"
}
for r in $(seq "$ROUNDS"); do
  if [ -n "$ARGS" ]; then
    for side in old new; do
      bin=$OLD; [ $side = new ] && bin=$NEW
      run $side $bin "$ARGS" $ARGS  # word-split on purpose: the bench arguments
    done
    continue
  fi
  for m in "${MODES[@]}"; do
    for side in old new; do
      bin=$OLD; [ $side = new ] && bin=$NEW
      run $side $bin "$m p512 n128" -p 512 -n 128 --kv-quantize "$m"
      run $side $bin "$m 4096-stored" -p 0 -n 64 -d 4096 --streaming-llm-sink 4 --streaming-llm-window 4092 --kv-quantize "$m"
    done
  done
done
python3 - "$res" "$ROUNDS" <<'PY'
import statistics, sys
rows = [l.rsplit(None, 1) for l in open(sys.argv[1])]
rows = [(a.split(None, 1)[0], a.split(None, 1)[1], float(b)) for a, b in rows]
lines = list(dict.fromkeys(r[1] for r in rows))
print(f"tokens/s, median of {sys.argv[2]} alternating rounds (old, new back to back each round)")
print("| line | old | new | new/old |")
print("| --- | ---: | ---: | ---: |")
for l in lines:
    o = statistics.median(v for t, k, v in rows if k == l and t == "old")
    n = statistics.median(v for t, k, v in rows if k == l and t == "new")
    print(f"| {l} | {o:.0f} | {n:.0f} | {n / o:.3f} |")
PY
