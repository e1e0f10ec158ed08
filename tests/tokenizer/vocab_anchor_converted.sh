#!/bin/sh
# GGUFs written by write_gguf_tokenizer (convert's path) must tokenize in
# llama.cpp exactly as in posttrainllm: converts fixture tokenizer.json files
# (and the GPT-2 vocabulary under other tokenizer.ggml.pre values), then runs
# vocab_anchor.mjs on them.
#   vocab_anchor_converted.sh NODE ANCHOR_MJS POSTTRAINLLM WRITE_VOCAB_GGUF SHARED_DIR OUT_DIR
set -eu
node=$1 mjs=$2 cli=$3 writer=$4 shared=$5 out=$6
fix=$shared/fixtures/tokenizers
mkdir -p "$out"
"$writer" "$shared/models/flagship-27m/tokenizer.json" "$shared/models/flagship-27m/tokenizer_config.json" "$out/flagship.gguf" llama
"$writer" "$fix/spm-bpe-32k/tokenizer.json" "$fix/spm-bpe-32k/tokenizer_config.json" "$out/spm32k.gguf" llama
"$writer" "$fix/gpt2/tokenizer.json" - "$out/gpt2.gguf" gpt2
for pre in default smollm qwen2 llama-bpe falcon; do
  "$writer" "$fix/gpt2/tokenizer.json" - "$out/gpt2-$pre.gguf" gpt2 "$pre"
done
exec "$node" "$mjs" "$cli" "$out"/*.gguf
