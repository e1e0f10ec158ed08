#!/bin/sh
# perplexity --llama-cpp against llama.cpp on flagship-27m's GGUF files
# (labels "anchor;slow"). For each file: our figure over 64 chunks of 512
# tokens of the held-out books (cat, file-name order) within 0.3% of
# llama-perplexity's in ../shared/models/flagship-27m-gguf/reference.md
# (f16 written by our own convert, as reference.md asks). q4_0 is checked
# against llama.cpp run here instead (node-llama-cpp, scripts/llamacpp_perplexity.mjs,
# the first 8 chunks): reference.md's 51.60 is not what llama.cpp computes on
# this machine (docs/GGUF.md, "Perplexity against llama.cpp", says why).
#   llamacpp_ppl_anchor.sh NODE POSTTRAINLLM SHARED_DIR REPO_DIR WORK_DIR
set -eu
NODE=$1 PT=$2 SHARED=$3 REPO=$4 WORK=$5
G=$SHARED/models/flagship-27m-gguf
mkdir -p "$WORK"
cat "$SHARED"/corpus/heldout/*.txt > "$WORK/heldout.txt"
"$PT" convert "$REPO/models/flagship-27m" "$WORK/flagship-f16.gguf" --type f16 > /dev/null
ours() {  # FILE CHUNKS -> our perplexity over all scored positions (the JSON also has per-bin "ppl"s)
  "$PT" perplexity "$1" "$WORK/heldout.txt" --llama-cpp --ctx 512 --chunks "$2" --json -q |
    "$NODE" -e 'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () =>
      console.log(JSON.parse(s).results[0].full_forward.ppl));'
}
theirs() {  # NAME -> llama.cpp's figure in reference.md ("| q8_0 | 27.6261 ± 0.6461 |")
  sed -n "s/^| $1 | \([0-9.]*\) ±.*/\1/p" "$G/reference.md"
}
check() {  # NAME OURS THEIRS WHERE
  awk -v n="$1" -v a="$2" -v b="$3" -v w="$4" 'BEGIN {
    if (a == "" || b == "") { printf "%s: missing figure (ours \"%s\", llama.cpp \"%s\")\n", n, a, b; exit 1 }
    r = a / b - 1; printf "%s: ours %.4f llama.cpp %.4f (%s) %+.3f%%\n", n, a, b, w, 100 * r
    exit (r < -0.003 || r > 0.003) ? 1 : 0 }'
}
fail=0
for q in f16 q8_0 q4_k_m; do
  f=$G/flagship-$q.gguf; [ "$q" = f16 ] && f=$WORK/flagship-f16.gguf
  check "$q" "$(ours "$f" 64)" "$(theirs "$q")" "reference.md, 64 chunks" || fail=1
done
lc=$("$NODE" "$REPO/scripts/llamacpp_perplexity.mjs" "$G/flagship-q4_0.gguf" "$WORK/heldout.txt" --chunks 8 --threads 2 |
     sed -n 's/.*"ppl":\([0-9.e+-]*\).*/\1/p')
check q4_0 "$(ours "$G/flagship-q4_0.gguf" 8)" "$lc" "node-llama-cpp here, 8 chunks" || fail=1
exit $fail
