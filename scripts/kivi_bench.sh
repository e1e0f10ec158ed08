#!/usr/bin/env bash
# Decode speed with 4,096 stored tokens per KV storage mode (issues 6 and 8:
# int4 and int8 at least as fast as fp32). The cache is a full StreamingLLM
# cache, sink 4 + window 4092 (4,096 slots): every timed step evicts one token
# and appends one, the steady state of a long generation. flagship-27m's
# context is 512, so this is a speed test only.
# Modes are run in alternation, ROUNDS times, and the median per mode is
# reported: on a shared VM the machine's speed drifts by tens of percent over
# minutes, so back-to-back blocks per mode would compare different machines.
# Usage: scripts/kivi_bench.sh [modes...]   (default: fp32 int8 int4 int2)
# Env: BIN (default build/app/posttrainllm), THREADS (2), ROUNDS (5), GEN (64),
#      DEPTH (4096), EXTRA (more cache flags, e.g. "--kivi-group 0").
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-5}
GEN=${GEN:-64}
DEPTH=${DEPTH:-4096}
MODES=(${*:-fp32 int8 int4 int2})
res=$(mktemp)
trap 'rm -f "$res"' EXIT
for r in $(seq "$ROUNDS"); do
  for m in "${MODES[@]}"; do
    "$BIN" bench models/flagship-27m -p 0 -n "$GEN" -r 1 -d "$DEPTH" --threads "$THREADS" \
      --streaming-llm-sink 4 --streaming-llm-window $((DEPTH - 4)) --kv-quantize "$m" ${EXTRA:-} --json |
      python3 -c 'import json,sys; d=json.load(sys.stdin); x=d["decode"]; print(sys.argv[1], x["tps_mean"], x["cache_bytes_at_end"], d["peak_rss_mib"])' "$m" >>"$res"
  done
done
python3 - "$res" "$DEPTH" "$GEN" "$ROUNDS" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
modes = list(dict.fromkeys(r[0] for r in rows))
depth, gen, rounds = sys.argv[2], sys.argv[3], sys.argv[4]
print(f"decode tokens/s with {depth} stored (full StreamingLLM cache), median of {rounds} alternating rounds of {gen} tokens")
print("| mode | median tok/s | all rounds | cache bytes | peak RSS MiB |")
print("| --- | ---: | --- | ---: | ---: |")
base = None
for m in modes:
    v = [float(r[1]) for r in rows if r[0] == m]
    med = statistics.median(v)
    base = base or med
    last = [r for r in rows if r[0] == m][-1]
    print(f"| {m} | {med:.1f} ({med / base:.2f}x) | {' '.join('%.0f' % x for x in v)} | {int(last[2]):,} | {float(last[3]):.1f} |")
EOF
