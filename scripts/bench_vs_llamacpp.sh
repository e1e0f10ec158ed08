#!/usr/bin/env bash
# Speed side by side with llama.cpp on the same GGUF file, alternated in one
# run (this VM drifts by tens of percent within minutes, so each round runs
# both engines back to back and the order flips every round):
#   ours:      posttrainllm bench FILE -p P -n N -r R --json
#   llama.cpp: node scripts/llamacpp_bench.mjs FILE -p P -n N -r R
# Both time prefill of P tokens on an empty cache and decode as llama-bench's
# tg (from an empty cache, one token per call). A figure is the median over
# ROUNDS of each run's mean tokens/s.
#
#   scripts/bench_vs_llamacpp.sh [OURS.gguf|OURS:LLAMA.gguf]...
#   env: P=512 N=128 R=3 ROUNDS=3 THREADS=2 JSON=out.json (raw runs)
# OURS:LLAMA times ours on OURS and llama.cpp on LLAMA (e.g. our bf16 against
# llama.cpp's f16 of the same weights, since llama.cpp's CPU bf16 is slower).
# llama.cpp runs at each thread count of LLAMA_THREADS (default "1 THREADS")
# and its figure is the best of them per round: on a 2-vCPU VM its thread pool
# decodes a small model slower with 2 threads than with 1 (flagship-27m Q8_0:
# ~70 vs ~350 tokens/s), so the anchor gets its best setting, ours runs at THREADS.
# Likewise at each of LLAMA_MMAP (default "1 0": mapped, and read into memory
# as llama.cpp's --no-mmap): ours reads the file into memory with huge pages
# by default (io/mmap.h), so llama.cpp is timed both ways and keeps its best.
# LLAMA_LOGITS (default 1): llama.cpp computes the logits of every decoded token and
# of the prompt's last, as llama-bench and ours do; 0 times it without the output
# layer, as this script did before session 15 (llamacpp_bench.mjs --logits).
# BW=1 (default, when build/bench/kernels_bench exists) measures the DRAM read
# bandwidth (ReadBandwidth, 1 GiB, THREADS threads, software prefetch as the
# decode kernels do) before each file in each round, so that "ours GB/s" has a
# denominator taken minutes, not hours, from it: the table's "% of read" is ours
# against the median of that file's bandwidth samples.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${P:-512} N=${N:-128} R=${R:-3} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-2}
LLAMA_THREADS=${LLAMA_THREADS:-$( [ "$THREADS" -gt 1 ] && echo "1 $THREADS" || echo 1 )}
LLAMA_MMAP=${LLAMA_MMAP:-1 0}
LLAMA_LOGITS=${LLAMA_LOGITS:-1}
BW=${BW:-1}
BUILD=${BUILD_DIR:-build}
BIN="$BUILD/app/posttrainllm"
[ $# -ge 1 ] || { echo "usage: scripts/bench_vs_llamacpp.sh FILE.gguf|OURS:LLAMA.gguf ..." >&2; exit 2; }
[ -x "$BIN" ] || { echo "bench_vs_llamacpp: $BIN not built (scripts/setup.sh)" >&2; exit 2; }
for spec in "$@"; do
  for f in ${spec/:/ }; do [ -f "$f" ] || { echo "bench_vs_llamacpp: $f: no such file" >&2; exit 2; }; done
done
# With JSON=FILE the raw runs go to FILE as they finish (kept if the run is cut short).
if [ -n "${JSON:-}" ]; then raw=$JSON; : >"$raw"; else raw=$(mktemp); trap 'rm -f "$raw"' EXIT; fi
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores," \
     "P=$P N=$N R=$R ROUNDS=$ROUNDS THREADS=$THREADS LLAMA_THREADS=\"$LLAMA_THREADS\" LLAMA_MMAP=\"$LLAMA_MMAP\" LLAMA_LOGITS=$LLAMA_LOGITS" >&2
ours() { "$BIN" bench "$1" -p "$P" -n "$N" -r "$R" --threads "$THREADS" --json 2>/dev/null | python3 -c "
import json, sys; j = json.load(sys.stdin)
print(json.dumps({'engine': 'ours', 'key': sys.argv[1], 'round': int(sys.argv[2]), 'simd': j['simd'],
  'prefill': j.get('prefill', {}).get('tps_mean'), 'decode': j.get('decode', {}).get('tps_mean'),
  'bytes_per_token': j.get('decode', {}).get('weight_bytes_per_token')}))" "$2" "$3"; }
theirs() {
  local t m
  for t in $LLAMA_THREADS; do
    for m in $LLAMA_MMAP; do
      node scripts/llamacpp_bench.mjs "$1" -p "$P" -n "$N" -r "$R" --threads "$t" --mmap "$m" --logits "$LLAMA_LOGITS" | python3 -c "
import json, sys; j = json.load(sys.stdin)
print(json.dumps({'engine': 'llama.cpp', 'key': sys.argv[1], 'round': int(sys.argv[2]), 'threads': int(sys.argv[3]),
  'mmap': int(sys.argv[4]), 'logits': j.get('logits'), 'prefill': j.get('prefill', {}).get('tps_mean'), 'decode': j.get('decode', {}).get('tps_mean')}))" "$2" "$3" "$t" "$m"
    done
  done
}
bandwidth() {  # a missing sample (no kernels_bench, a THREADS it has no case for) leaves the column "-"
  local kb="$BUILD/bench/kernels_bench" out
  [ "$BW" = 1 ] && [ -x "$kb" ] || return 0
  out=$("$kb" --benchmark_filter="ReadBandwidth/bytes:1073741824/threads:$THREADS/prefetch:1" --benchmark_min_time=0.5 \
      --benchmark_format=json 2>/dev/null) || return 0
  echo "$out" | python3 -c "
import json, sys; j = json.load(sys.stdin); b = j['benchmarks'][0]
print(json.dumps({'engine': 'bandwidth', 'key': sys.argv[1], 'round': int(sys.argv[2]), 'gbps': b['bytes_per_second'] / 1e9}))" "$1" "$2" \
    2>/dev/null || true
}
for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    o=${spec%%:*}; l=${spec#*:}
    bandwidth "$spec" "$round" >>"$raw"
    if [ $((round % 2)) -eq 1 ]; then
      ours "$o" "$spec" "$round" >>"$raw"; theirs "$l" "$spec" "$round" >>"$raw"
    else
      theirs "$l" "$spec" "$round" >>"$raw"; ours "$o" "$spec" "$round" >>"$raw"
    fi
    echo "round $round/$ROUNDS: $spec done" >&2
  done
done
python3 - "$raw" "$P" "$N" "$@" <<'EOF'
import json, os, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
P, N, specs = sys.argv[2], sys.argv[3], sys.argv[4:]
med = lambda xs: statistics.median(xs) if xs else float('nan')
print(f"| file (ours : llama.cpp) | pp{P} ours | pp{P} llama.cpp (threads, mmap) | ratio | tg{N} ours | tg{N} llama.cpp (threads, mmap) | ratio | ours GB/s | read GB/s | % of read |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for s in specs:
    def get(e, k):
        vals = {}
        for r in runs:
            if r['key'] == s and r['engine'] == e and r.get(k) is not None:
                vals[r['round']] = max(vals.get(r['round'], 0), r[k])  # llama.cpp: best setting
        return list(vals.values())
    best = lambda k: statistics.mode([(lambda r: f"{r['threads']}, {'mmap' if r.get('mmap', 1) else 'read'}")(
                                          max((r for r in runs if r['key'] == s and r['engine'] == 'llama.cpp' and r['round'] == rd and r.get(k)), key=lambda r: r[k]))
                                      for rd in {r['round'] for r in runs if r['key'] == s}] or ['-'])
    op, lp, od, ld = med(get('ours', 'prefill')), med(get('llama.cpp', 'prefill')), med(get('ours', 'decode')), med(get('llama.cpp', 'decode'))
    b = med(get('ours', 'bytes_per_token'))
    bw = med([r['gbps'] for r in runs if r['key'] == s and r['engine'] == 'bandwidth'])
    name = ' : '.join(os.path.basename(x) for x in s.split(':', 1))
    bwc = f"{bw:.1f} | {100 * b * od / 1e9 / bw:.0f}%" if bw == bw else "- | -"
    print(f"| {name} | {op:.1f} | {lp:.1f} ({best('prefill')}) | {op / lp:.2f} | {od:.1f} | {ld:.1f} ({best('decode')}) | {od / ld:.2f} | {b * od / 1e9:.1f} | {bwc} |")
EOF
