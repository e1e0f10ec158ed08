// Reading and writing the tokenizer.ggml.* metadata of GGUF files
// (see gguf_vocab.h for the tokenizer semantics).
#pragma once

#include <string>
#include <string_view>

#include "io/gguf.h"
#include "tokenizer/gguf_vocab.h"

namespace ptllm {

// The tokenizer.ggml.* keys (and general.name) of a GGUF file. Throws
// ptllm::Error naming the file and key when the file has no tokenizer or a key
// has the wrong type.
GgufVocab read_gguf_vocab(const GgufFile& f);
Tokenizer tokenizer_from_gguf(const GgufFile& f);

// Writes tokenizer.ggml.{model, pre, tokens, scores, token_type, merges,
// bos/eos/unknown/padding_token_id, add_bos_token, add_eos_token,
// add_space_prefix} the way llama.cpp's converter names and types them.
void write_gguf_vocab(const GgufVocab& v, GgufWriter& w);
// convert's entry point: gguf_vocab_from_hf + write_gguf_vocab.
void write_gguf_tokenizer(std::string_view tokenizer_json, std::string_view tokenizer_config_json, GgufWriter& w);

}  // namespace ptllm
