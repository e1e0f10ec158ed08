#!/usr/bin/env bash
# Two builds of a Google Benchmark binary (bench/quant_bench, bench/kernels_bench)
# alternated round by round on the benchmarks FILTER selects: each round runs
# OLD then NEW with --benchmark_repetitions=3 and keeps each benchmark's median
# GFLOPs counter, so the VM's drift hits both alike. Prints every round's
# figures per binary and benchmark.
# Usage: scripts/ab_kernels.sh OLD_BIN NEW_BIN FILTER [ROUNDS (5)]
# e.g.   scripts/ab_kernels.sh /tmp/old/quant_bench build/bench/quant_bench 'QMatmul<DType::Q4_0_R16>'
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 OLD_BIN NEW_BIN FILTER [ROUNDS]" >&2; exit 2; }
OLD=$1 NEW=$2 FILTER=$3 ROUNDS=${4:-5}
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "ab_kernels: $b is not an executable" >&2; exit 2; }; done
res=$(mktemp)
trap 'rm -f "$res"' EXIT
for r in $(seq "$ROUNDS"); do
  for tag in old new; do
    bin=$OLD
    [ "$tag" = new ] && bin=$NEW
    "$bin" --benchmark_filter="$FILTER" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>/dev/null |
      awk -v tag="$tag" '/_median/ { for (i = 1; i <= NF; ++i) if ($i ~ /^GFLOPs=/) { split($i, a, "="); sub(/\/s$/, "", a[2]); name = $1; sub(/_median$/, "", name); print tag, name, a[2] } }' >>"$res"
  done
done
[ -s "$res" ] || { echo "ab_kernels: no benchmark matched '$FILTER' (or none reports GFLOPs)" >&2; exit 1; }
echo "GFLOP/s, median of 3 repetitions per round, $ROUNDS rounds alternated (old then new)"
awk '{ k = $2 " " $1; v[k] = v[k] " " $3 } END { for (k in v) print k ":" v[k] }' "$res" | sort
