#!/usr/bin/env bash
# `serve --device cuda` on the GPU (issue 17): many concurrent streams on stories260K, greedy,
# the same request alone vs among 63 others (batch invariance on the GPU), vs the CPU server,
# per-request int4 + sink/window caches; then a 1B-shape random model's aggregate at 1/16/64
# streams (KV1B='{"quantize":"int4","sink":4,"window":1020}' gives each request a bounded cache;
# unbounded, a 1B request reserves its whole 128K context and one fits in --kv-budget 8GiB).
# Run from a folder holding prebuilt/ (as scripts/cuda_batch_device.sh), shared-lite/ and
# serve_load_stdlib.py and cuda_device_env.sh (the device has Python but no Node). DEVS="" skips the stories260K part.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
start() {  # log, args... -> sets URL, SPID
  local log=$1; shift
  $B/posttrainllm serve "$@" --port 0 2>"$log" & SPID=$!
  URL=""; for _ in $(seq 300); do URL=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" || true); [ -n "$URL" ] && break; sleep 0.1; done
  [ -n "$URL" ] || { echo "server did not start:"; cat "$log"; }
}
stop() { kill -TERM $SPID; wait $SPID; echo "server exit $?"; }
M=shared-lite/models/stories260K
for dev in ${DEVS-cuda cpu}; do
  echo "== stories260K, --device $dev, --max-sequences 64"
  start "$OUT/serve_$dev.log" $M --device $dev --max-sequences 64 --kv-budget 1GiB --threads 8
  echo "alone:";     python3 serve_load_stdlib.py "$URL" 1 200 | tee -a "$OUT/load.jsonl" | cut -c1-400
  echo "64 at once:"; python3 serve_load_stdlib.py "$URL" 64 200 | tee -a "$OUT/load.jsonl" | cut -c1-400
  echo "64 at once, int4 sink 4 + window 60:"; python3 serve_load_stdlib.py "$URL" 64 200 '{"kv_cache":{"quantize":"int4","sink":4,"window":60}}' | tee -a "$OUT/load.jsonl" | cut -c1-400
  curl -s "$URL/metrics" | grep -E "^ptllm_(kv|batch|requests|finished)" | head -20 | tee "$OUT/metrics_$dev.txt"
  stop
done
echo "== 1B shape (random bf16), --device cuda, 1/16/64 streams x 128 tokens (token-id prompts), each request's cache: ${KV1B:-unbounded}"
timeout 120 $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
start "$OUT/serve_1b.log" /tmp/l1b.gguf --device cuda --max-sequences 64 --kv-budget 8GiB
for k in 1 16 64; do
  echo "$k streams:"; python3 serve_load_stdlib.py "$URL" $k 128 "{\"prompt\":[1,2,3,4,5,6,7,8]${KV1B:+,\"kv_cache\":$KV1B}}" | tee -a "$OUT/load_1b.jsonl" | cut -c1-300
done
curl -s "$URL/metrics" | grep -E "^ptllm_(kv|batch)" | head -14
stop
