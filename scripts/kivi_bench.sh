#!/usr/bin/env bash
# Decode time per token with 4,096 tokens already stored, per KV storage mode
# (flagship-27m's context is 512, so the cache is a StreamingLLM cache whose
# window holds all 4,096: nothing is evicted during the timed decode).
# Usage: BIN=build-kivi/app/posttrainllm THREADS=1 scripts/kivi_bench.sh [modes...]
set -euo pipefail
BIN=${BIN:-build-kivi/app/posttrainllm}
THREADS=${THREADS:-1}
MODES=${*:-fp32 int8 int4 int2}
for m in $MODES; do
  echo "== $m"
  "$BIN" bench models/flagship-27m -p 0 -n ${GEN:-32} -r ${REPEAT:-3} -d 4096 --threads "$THREADS" \
    --streaming-llm-sink 4 --streaming-llm-window 4096 --kv-quantize "$m" ${EXTRA:-} 2>&1 | grep -v '^\s*$'
done
