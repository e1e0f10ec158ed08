#!/usr/bin/env bash
# Million-token run (issue 9): stories260K generates TOKENS (default
# 1,000,000) tokens with StreamingLLM sink 4 + window 252 and an int4 KV cache,
# twice with the same seed. Checks:
#   * both runs generate exactly TOKENS tokens (stop: length). The engine
#     checks every forward's logits and stops with "non-finite logits at
#     position N" on a NaN/Inf (src/engine/session.cc), so a completed run
#     saw finite logits at every one of the TOKENS steps;
#   * memory is flat: anonymous RSS (RssAnon: cache, buffers, heap; weights
#     --mmap'ed, outside it), sampled
#     by `--report-every REPORT` inside the process, may grow after the first
#     sample only by the generated-id list `sample` keeps for its report
#     (int32 per token, in a doubling vector: <= 8 bytes/token) plus SLACK_KIB;
#     VmRSS is also sampled from outside every SAMPLE_S seconds;
#   * determinism: the SHA-256 of the generated ids is the same in both runs.
# Usage: scripts/million_tokens.sh      env: BIN, TOKENS, KV (int4), SEED, THREADS (1),
#   REPORT (50000), SAMPLE_S (10), SLACK_KIB (4096), OUT_DIR (/tmp/million_tokens), RUNS (2), PARALLEL (1)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
TOKENS=${TOKENS:-1000000}
KV=${KV:-int4}
SEED=${SEED:-1234}
THREADS=${THREADS:-1}
REPORT=${REPORT:-50000}
SAMPLE_S=${SAMPLE_S:-10}
SLACK_KIB=${SLACK_KIB:-4096}
OUT_DIR=${OUT_DIR:-/tmp/million_tokens}
RUNS=${RUNS:-2}
MODEL=models/stories260K
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -x "$BIN" ] || { echo "million_tokens: $BIN not built (set BIN=...)" >&2; exit 2; }
mkdir -p "$OUT_DIR"
# Runs go concurrently (PARALLEL=1, default) or one after another (PARALLEL=0);
# each is single-threaded, so concurrent runs do not disturb each other's ids.
PARALLEL=${PARALLEL:-1}
run_one() {  # run index: writes run$1.json / .err / .vmrss / .secs
  local out=$OUT_DIR/run$1.json err=$OUT_DIR/run$1.err rss=$OUT_DIR/run$1.vmrss start pid v rc=0
  start=$(date +%s)
  "$BIN" sample "$MODEL" --mmap --prompt "Once upon a time" --tokens "$TOKENS" --ignore-eos --temperature 0.8 --seed "$SEED" \
    --threads "$THREADS" --kv-quantize "$KV" --streaming-llm-sink 4 --streaming-llm-window 252 \
    --report-every "$REPORT" --json >"$out" 2>"$err" &
  pid=$!
  : >"$rss"
  while kill -0 "$pid" 2>/dev/null; do
    v=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$v" ] && echo "$(($(date +%s) - start)) $v" >>"$rss"
    sleep "$SAMPLE_S"
  done
  wait "$pid" || rc=$?
  echo "$(($(date +%s) - start)) $rc" >"$OUT_DIR/run$1.secs"
}
echo "== $RUNS run(s) of $TOKENS tokens, --kv-quantize $KV, sink 4 + window 252, seed $SEED, $THREADS thread(s) each, parallel=$PARALLEL"
pids=()
for run in $(seq 1 "$RUNS"); do
  if [ "$PARALLEL" = 1 ]; then run_one "$run" & pids+=($!); else run_one "$run"; fi
done
for p in "${pids[@]}"; do wait "$p"; done

fail=0
hashes=()
for run in $(seq 1 "$RUNS"); do
  out=$OUT_DIR/run$run.json err=$OUT_DIR/run$run.err rss=$OUT_DIR/run$run.vmrss
  read -r secs rc <"$OUT_DIR/run$run.secs"
  echo "== run $run"
  if [ "$rc" != 0 ]; then
    echo "run $run: sample failed (exit $rc):"; tail -n 3 "$err"; fail=1; continue
  fi
  # One pass over the JSON: counts, stop reason and the hash of the ids.
  read -r n stop kvb tps hash < <(python3 - "$out" <<'PY'
import hashlib, json, struct, sys
j = json.load(open(sys.argv[1]))
ids = j["generated_ids"]
h = hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest()
print(len(ids), j["stats"]["stop_reason"], j["stats"]["kv_cache_bytes"], round(j["stats"]["decode_tokens_per_second"]), h)
PY
)
  hashes+=("$hash")
  echo "generated $n tokens in ${secs}s ($tps tok/s decode), stop: $stop, kv cache $kvb bytes, sha256(ids) $hash"
  [ "$n" = "$TOKENS" ] && [ "$stop" = length ] || { echo "run $run: expected $TOKENS tokens and stop: length"; fail=1; }
  echo "RssAnon / VmHWM from --report-every $REPORT (KiB):"
  awk '/^\[kv\] generated/ {
         g = $3; a = $0; sub(/.*anon RSS /, "", a); sub(/ KiB.*/, "", a); r = $0; sub(/.*peak RSS /, "", r); sub(/ KiB.*/, "", r)
         printf "  %8d tokens  anon %7d  peak %7d\n", g, a, r }' "$err"
  read -r g1 a1 gl al < <(awk '/^\[kv\] generated/ { g = $3; a = $0; sub(/.*anon RSS /, "", a); sub(/ KiB.*/, "", a);
                              if (!n++) { g1 = g; a1 = a }; gl = g; al = a } END { print g1, a1, gl, al }' "$err")
  allowed=$(( (gl - g1) * 8 / 1024 + SLACK_KIB ))
  echo "  anon growth from $g1 to $gl tokens: $((al - a1)) KiB (allowed $allowed KiB: 8 B/token id list + $SLACK_KIB)"
  [ $((al - a1)) -le "$allowed" ] || { echo "run $run: anonymous RSS is not flat"; fail=1; }
  echo "VmRSS sampled every ${SAMPLE_S}s (s:KiB): $(awk '{ printf "%s:%s ", $1, $2 }' "$rss")"
done
if [ "${#hashes[@]}" -ge 2 ]; then
  if [ "$(printf '%s\n' "${hashes[@]}" | sort -u | wc -l)" -eq 1 ]; then echo "deterministic: all $RUNS runs gave the same ids"
  else echo "NOT deterministic: ${hashes[*]}"; fail=1; fi
fi
[ $fail -eq 0 ] && echo "million_tokens: OK" || echo "million_tokens: FAILED"
exit $fail
