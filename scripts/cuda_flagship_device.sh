#!/usr/bin/env bash
# Issue 17, session 28: flagship-27m (bf16 weights) on the GPU against the CPU, which the
# lite shared folder of the other device scripts leaves out, taken again after session 27's
# fix of the weight upload (2-byte weights were converted from a half-copied staging buffer).
# Runs all of cuda_backend_test with the Flagship27m test (300 prompt tokens, 40 decode steps,
# every cache mode at its tolerance), greedy text CPU against GPU, and perplexity through the
# cache CPU against GPU.
# Staged in a folder of its own (the model does not fit the carry limit beside the other
# binaries): prebuilt/{lib,bin}.tar.xz (bin: posttrainllm and cuda_backend_test),
# flagship.tar.xz (models/flagship-27m: config, safetensors, tokenizer), shared-lite/ (as the
# other scripts': fixtures and text.txt; its stories260K linked to the repo's),
# cuda_device_env.sh and this script:
#   cd build-flag && bash cuda_flagship_device.sh
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. ./cuda_device_env.sh
device_preamble
# shared-lite's stories260K is the repo's (models/stories260K), linked here to keep the carry small.
[ -e shared-lite/models/stories260K ] || { mkdir -p shared-lite/models && ln -sfn "$PWD/../models/stories260K" shared-lite/models/stories260K; }
m=/tmp/flag/flagship-27m
[ -d $m ] || { mkdir -p /tmp/flag && tar xJf flagship.tar.xz -C /tmp/flag; }
echo "== cuda_backend_test, Flagship27m included"
PTLLM_FLAGSHIP=$m timeout 400 $B/cuda_backend_test > "$OUT/all.txt" 2>&1
echo "rc $?"; grep -E '^\[  (FAILED|PASSED)|tests ran|flagship-27m ·|Failure' "$OUT/all.txt" | cut -c1-260 | head -40
echo "== greedy text, CPU against GPU (200 tokens)"
for q in "--kv-quantize fp16" "--kv-quantize int4" "--kv-quantize int2 --streaming-llm-sink 4 --streaming-llm-window 124"; do
  # shellcheck disable=SC2086
  c=$($B/posttrainllm sample $m -p "Once upon a time" -n 200 -t 0 $q 2>/dev/null)
  # shellcheck disable=SC2086
  g=$($B/posttrainllm sample $m -p "Once upon a time" -n 200 -t 0 $q --device cuda 2>/dev/null)
  if [ -n "$c" ] && [ "$c" = "$g" ]; then echo "[$q] identical"; else echo "[$q] DIFFER (cpu ${#c} chars, gpu ${#g})"; fi
done
echo "== perplexity through the cache, CPU against GPU (8 windows of 256)"
for q in fp16 int8 int4 int2 "int4 --streaming-llm-sink 4 --streaming-llm-window 124"; do
  line="[$q]"
  for dev in cpu cuda; do
    # shellcheck disable=SC2086
    p=$($B/posttrainllm perplexity $m shared-lite/text.txt -w 256 -k 8 --cache-only -q --json --device $dev --kv-quantize $q 2>&1 |
        tr -d '\n' | python3 -c "import json,sys; print(repr(json.load(sys.stdin)['results'][0]['through_cache']['ppl']))" 2>/dev/null || echo nan)
    line="$line $dev $p"
  done
  echo "$line" | python3 -c "
import sys; w = sys.stdin.read().split(); c, g = float(w[-3]), float(w[-1])
print(' '.join(w), ' rel diff %.4f%%' % (abs(g - c) / c * 100))" 2>/dev/null || echo "$line"
done
