#!/usr/bin/env bash
# The correctness anchor for `perplexity`: flagship-27m, fp32, 64 windows of
# 512 tokens over the held-out books in file-name order, by the full forward
# AND token by token through the cache. Both must equal transformers'
# heldout_ppl_fp32 (models/flagship-27m/reference.json) within 0.1%, and the
# cache path must equal the full forward within 1e-4 relative.
# Usage: BIN=build/app/posttrainllm THREADS=2 scripts/eval_reference.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
MODEL=${MODEL:-models/flagship-27m}
CORPUS=${CORPUS:-}
if [ -z "$CORPUS" ]; then
  for d in corpus/heldout ../shared/corpus/heldout; do [ -d "$d" ] && CORPUS=$d && break; done
fi
[ -n "$CORPUS" ] || { echo "error: no corpus/heldout (set CORPUS=...)" >&2; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mapfile -t files < <(ls "$CORPUS"/*.txt | LC_ALL=C sort)
json=$("$BIN" perplexity "$MODEL" "${files[@]}" --window 512 --max-windows 64 --through-cache --json \
  ${THREADS:+--threads "$THREADS"})
ref=$(jq '.heldout_ppl_fp32.ppl' "$MODEL/reference.json")
full=$(jq '.results[0].full_forward.ppl' <<<"$json")
cache=$(jq '.results[0].through_cache.ppl' <<<"$json")
full_tps=$(jq '.results[0].full_forward.tokens_per_second' <<<"$json")
cache_tps=$(jq '.results[0].through_cache.tokens_per_second' <<<"$json")
n=$(jq '.results[0].full_forward.predictions' <<<"$json")
echo "transformers $ref · full forward $full ($full_tps tok/s) · through cache $cache ($cache_tps tok/s) · $n predictions"
jq -n --argjson r "$ref" --argjson f "$full" --argjson c "$cache" --argjson n "$n" '
  def rel(a; b): ((a / b) - 1) | fabs;
  {full_vs_ref: rel($f; $r), cache_vs_ref: rel($c; $r), cache_vs_full: rel($c; $f), predictions: $n}' |
  tee /dev/stderr |
  jq -e '.full_vs_ref <= 1e-3 and .cache_vs_ref <= 1e-3 and .cache_vs_full <= 1e-4 and .predictions == 32704' >/dev/null \
  && echo "PASS: within 0.1% of transformers by both paths; cache path within 1e-4 of the full forward" \
  || { echo "FAIL" >&2; exit 1; }
