#!/usr/bin/env bash
# llama.cpp side by side on GGUF files we write: converts the flagship to GGUF
# (--type, default f16), makes a small random model with make-random, and
# checks that llama.cpp (scripts/llamacpp_greedy.mjs, node-llama-cpp) loads
# each and that its greedy ids equal ours (build/tests/model/gguf_greedy) for
# the five prompts of models/flagship-27m/reference.json, TOKENS each.
#
#   scripts/gguf_anchor.sh [TYPE] [TOKENS]      # exit 1 on any difference
set -euo pipefail
cd "$(dirname "$0")/.."
TYPE=${1:-f16}
TOKENS=${2:-48}
BUILD=${BUILD_DIR:-build}
cmake --build "$BUILD" --target posttrainllm gguf_greedy >/dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$BUILD/app/posttrainllm" convert models/flagship-27m "$dir/flagship.gguf" --type "$TYPE" 2>/dev/null
"$BUILD/app/posttrainllm" make-random "$dir/random.gguf" --preset llama-3.2-1b --layers 2 --vocab 512 --type "$TYPE" 2>/dev/null
python3 -c "
import json
for p in json.load(open('models/flagship-27m/reference.json'))['prompts']: print(','.join(map(str, p['prompt_ids'])))
" >"$dir/prompts"
echo "1,5,7,300" >>"$dir/random_prompts"
status=0
check() {  # FILE PROMPTS
  local n=0 ok=0
  while read -r ids; do
    n=$((n + 1))
    a=$(node scripts/llamacpp_greedy.mjs "$1" --ids "$ids" --tokens "$TOKENS")
    b=$("$BUILD/tests/model/gguf_greedy" "$1" "$ids" "$TOKENS")
    # llama.cpp stops at an end-of-generation token: compare its ids as a prefix of ours.
    if [ "$a" = "$b" ] || [ "${b#"$a",}" != "$b" ]; then ok=$((ok + 1)); else
      echo "DIFF $(basename "$1") prompt $ids"; echo "  llama.cpp: $a"; echo "  ours:      $b"; status=1; fi
  done <"$2"
  echo "$(basename "$1") ($TYPE): $ok of $n prompts give the same $TOKENS greedy ids in llama.cpp and here"
}
check "$dir/flagship.gguf" "$dir/prompts"
check "$dir/random.gguf" "$dir/random_prompts"
exit $status
