#!/usr/bin/env bash
# KIVI grouped vs simple on flagship-27m, held-out books (docs/EVALUATION.md,
# "KIVI grouped vs simple").
#   WINDOWS: 512-token windows scored token by token through the cache (default 64)
#   STREAM:  tokens of Pride and Prejudice fed through sink 4 + window 252, reposition (default 8192)
# Usage: BIN=build-kivi/app/posttrainllm PPL=build-kivi/tests/kv/kivi_ppl WINDOWS=64 scripts/kivi_eval.sh
set -euo pipefail
BIN=${BIN:-build-kivi/app/posttrainllm}
PPL=${PPL:-build-kivi/tests/kv/kivi_ppl}
WINDOWS=${WINDOWS:-64}
STREAM=${STREAM:-8192}
THREADS=${THREADS:-1}
H=${HELDOUT:-/work/shared/corpus/heldout}
M=models/flagship-27m
echo "## window perplexity, $WINDOWS x 512 through the cache (grouped G 32 R 128 = default)"
"$BIN" perplexity $M $H/*.txt --window 512 --max-windows "$WINDOWS" --through-cache \
  --kv-quantize fp32,int8,int4,int2 -q --threads "$THREADS"
echo "## simple scheme (--kivi-group 0) through the same eval library"
for q in int8 int4 int2; do OMP_NUM_THREADS=$THREADS "$PPL" $M window "$WINDOWS" $q $q 0 0 0 0 $H/*.txt; done
echo "## asymmetric K int4 / V int2 (grouped)"
OMP_NUM_THREADS=$THREADS "$PPL" $M window "$WINDOWS" int4 int2 32 128 0 0 $H/*.txt
echo "## stream, $STREAM tokens, sink 4 + window 252, reposition"
"$BIN" perplexity $M $H/austen__pride_and_prejudice.txt --stream "$STREAM" --streaming-llm-sink 4 \
  --streaming-llm-window 252 --streaming-llm-rope reposition --kv-quantize fp32,int4,int2 -q --threads "$THREADS"
OMP_NUM_THREADS=$THREADS "$PPL" $M stream "$STREAM" int4 int4 0 0 4 252 $H/austen__pride_and_prejudice.txt
