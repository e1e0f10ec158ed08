#!/usr/bin/env bash
# The scheduling noise floor of this machine, for reading latency tails (docs/SERVER.md,
# "Session 25"): scripts/vm_jitter.c with 1 busy thread, as many as cores, and one more
# than cores, ROUNDS times each, alternated. Nothing else should run meanwhile.
#   ROUNDS=2 SECONDS_EACH=5 scripts/vm_jitter.sh   (SECONDS is bash's own variable)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}; SECS=${SECONDS_EACH:-5}
bin=$(mktemp -d)/vm_jitter
trap 'rm -rf "$(dirname "$bin")"' EXIT
cc -O2 -pthread -o "$bin" scripts/vm_jitter.c
cores=$(nproc)
echo "$(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for n in 1 "$cores" $((cores + 1)); do "$bin" "$n" "$SECS" | sed "s/^/round $r: /"; done
done
