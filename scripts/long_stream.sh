#!/usr/bin/env bash
# Long-stream check of the bounded KV cache (issue 4): flagship-27m generates
# TOKENS (default 10,000) tokens with StreamingLLM sink 4 + window 252 in every
# --kv-quantize mode. For each mode it checks, from sample's per-token
# `--report-every 1` lines on stderr:
#   * the stored count is <= 256 in every layer at every step;
#   * the anonymous RSS (RssAnon: the cache, buffers, heap; the weights are
#     --mmap'ed so that they are not in it) after TOKENS tokens
#     is within 5% of that after 1,000;
#   * peak RSS (VmHWM) is reported the same way. It also counts file-backed
#     pages of the mmapped weights, and the embedding table is paged in row by
#     row as new tokens are sampled, so VmHWM keeps rising while the cache
#     stays flat; the check is that its growth stays below the embedding
#     table's size (EMBED_KIB, 16,000 KiB for flagship-27m);
#   * text was printed (stdout holds the generated text).
# Usage: scripts/long_stream.sh [modes...]
#   env: BIN, TOKENS, THREADS, OUT_DIR, MODEL, EMBED_KIB; ANALYZE_ONLY=1 re-checks OUT_DIR without running.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/app/posttrainllm}
TOKENS=${TOKENS:-10000}
THREADS=${THREADS:-0}
OUT_DIR=${OUT_DIR:-/tmp/long_stream}
MODEL=${MODEL:-models/flagship-27m}
EMBED_KIB=${EMBED_KIB:-16000}
ANALYZE_ONLY=${ANALYZE_ONLY:-0}
SINK=4
WINDOW=252
CAP=$((SINK + WINDOW))
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(fp32 fp16 bf16 int8 int4)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT_DIR"
[ "$ANALYZE_ONLY" = 1 ] || [ -x "$BIN" ] || { echo "long_stream: $BIN not built (set BIN=...)" >&2; exit 2; }

fail=0
printf '%-5s %7s %6s %9s %11s %11s %7s %11s %11s %7s %10s %7s\n' mode tokens stored kv_bytes hwm@1k_KiB hwm@end_KiB growth anon@1k_KiB anon@end_KiB growth text_bytes tok/s
for mode in "${MODES[@]}"; do
  out="$OUT_DIR/$mode.out" err="$OUT_DIR/$mode.err"
  [ "$ANALYZE_ONLY" = 1 ] || "$BIN" sample "$MODEL" --mmap --prompt "Once upon a time" --tokens "$TOKENS" --ignore-eos --temperature 0.8 --seed 1 \
    --threads "$THREADS" --kv-quantize "$mode" --streaming-llm-sink "$SINK" --streaming-llm-window "$WINDOW" \
    --report-every 1 >"$out" 2>"$err" || { echo "$mode: sample failed (see $err)"; fail=1; continue; }
  # [kv] generated G · position P · stored ... (max S) · kv B bytes · peak RSS R KiB
  read -r steps max_stored rss1k rssend anon1k anonend kvb < <(awk '
    /^\[kv\] generated/ {
      g = $3; s = $0; sub(/.*\(max /, "", s); sub(/\).*/, "", s); r = $0; sub(/.*peak RSS /, "", r); sub(/ KiB.*/, "", r)
      a = $0; sub(/.*anon RSS /, "", a); sub(/ KiB.*/, "", a); b = $0; sub(/.*· kv /, "", b); sub(/ bytes.*/, "", b)
      n++; if (s + 0 > mx) mx = s + 0; if (g == 1000) { r1 = r; a1 = a }; last = r; lasta = a; kb = b
    }
    END { print n, mx, r1, last, a1, lasta, kb }' "$err")
  text_bytes=$(wc -c <"$out")
  tps=$(sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' "$err" | tail -1)
  growth=$(awk -v a="$rss1k" -v b="$rssend" 'BEGIN { printf "%.2f%%", (b - a) * 100 / a }')
  agrowth=$(awk -v a="$anon1k" -v b="$anonend" 'BEGIN { printf "%.2f%%", (b - a) * 100 / a }')
  printf '%-5s %7s %6s %9s %11s %11s %7s %11s %11s %7s %10s %7s\n' "$mode" "$steps" "$max_stored" "$kvb" "$rss1k" "$rssend" \
    "$growth" "$anon1k" "$anonend" "$agrowth" "$text_bytes" "$tps"
  [ "$steps" -eq "$TOKENS" ] || { echo "$mode: $steps report lines, expected $TOKENS"; fail=1; }
  [ "$max_stored" -le "$CAP" ] || { echo "$mode: stored $max_stored > $CAP"; fail=1; }
  awk -v a="$rss1k" -v b="$rssend" -v e="$EMBED_KIB" 'BEGIN { exit !(b - a <= e) }' ||
    { echo "$mode: peak RSS grew by more than the embedding table"; fail=1; }
  awk -v a="$anon1k" -v b="$anonend" 'BEGIN { exit !(b <= a * 1.05) }' || { echo "$mode: anonymous RSS grew more than 5%"; fail=1; }
  [ "$text_bytes" -gt $((TOKENS)) ] || { echo "$mode: only $text_bytes bytes of text"; fail=1; }
done
[ "$fail" -eq 0 ] && echo "long_stream: all checks passed" || echo "long_stream: FAILED"
exit "$fail"
