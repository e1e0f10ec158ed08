#!/usr/bin/env bash
# Greedy prefix match of each --kv-quantize mode against fp32 (docs/EVALUATION.md,
# "Cache modes"): for each prompt, `sample --json --temperature 0` generates
# TOKENS tokens per mode; the score is the number of leading generated ids
# equal to fp32's. Usage: scripts/kv_prefix_match.sh   (env: BIN, TOKENS, THREADS, MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
TOKENS=${TOKENS:-60}
THREADS=${THREADS:-0}
MODEL=${MODEL:-models/flagship-27m}
PROMPTS=("The first president" "In machine learning" "Once upon a time" "Photosynthesis is")
MODES=(fp16 bf16 int8 int4)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ids() {  # mode prompt -> generated ids, comma-separated
  "$BIN" sample "$MODEL" --prompt "$2" --tokens "$TOKENS" --temperature 0 --ignore-eos --threads "$THREADS" \
    --kv-quantize "$1" --json 2>/dev/null | jq -c '.generated_ids | join(",")' -r
}
printf '| prompt |'; for m in "${MODES[@]}"; do printf ' %s |' "$m"; done; printf '\n|---|'
for m in "${MODES[@]}"; do printf -- '---|'; done; printf '\n'
declare -A total
for p in "${PROMPTS[@]}"; do
  ref=$(ids fp32 "$p")
  printf '| %s |' "$p"
  for m in "${MODES[@]}"; do
    got=$(ids "$m" "$p")
    n=$(awk -v a="$ref" -v b="$got" 'BEGIN { n = split(a, x, ","); split(b, y, ","); k = 0
        while (k < n && x[k + 1] == y[k + 1]) k++; print k }')
    total[$m]=$(( ${total[$m]:-0} + n ))
    printf ' %s/%s |' "$n" "$TOKENS"
  done
  printf '\n'
done
printf '| **total** |'; for m in "${MODES[@]}"; do printf ' **%s/%s** |' "${total[$m]}" $((TOKENS * ${#PROMPTS[@]})); done; printf '\n'
