// Tokenizers described by GGUF metadata (tokenizer.ggml.*), with llama.cpp's
// semantics so that ids match llama.cpp on the same file:
//   model "llama": SentencePiece, score-based: repeatedly merge the adjacent
//     pair whose concatenation is the vocabulary token with the highest score;
//     " " -> U+2581, a leading space per add_space_prefix, unknown characters
//     as <0xXX> byte tokens.
//   model "gpt2": byte-level BPE with ranked merges after the regex
//     pre-tokenizer named by tokenizer.ggml.pre.
// Control (type 3), user-defined (4) and unknown (2) tokens written in the
// text are matched as whole tokens first (control/unknown only when special
// parsing is on). This header does not depend on io/: gguf.h reads and writes
// the struct from/to a GGUF file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ptllm {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class GgufTokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

struct GgufVocab {
  std::string model;                 // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;                   // tokenizer.ggml.pre ("" = llama.cpp's "default")
  std::string name;                  // general.name (llama.cpp keys a few per-model fixes on it)
  std::vector<std::string> tokens;   // id -> text
  std::vector<float> scores;         // id -> score (empty = all 0)
  std::vector<int32_t> token_type;   // id -> GgufTokenType (empty = all normal)
  std::vector<std::string> merges;   // "a b", rank order (gpt2)
  std::optional<int32_t> bos, eos, unk, pad;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// Builds a tokenizer; `where` names the source in errors (e.g. the file path).
// Throws ptllm::Error for an unsupported model / pre-tokenizer or
// inconsistent arrays.
Tokenizer tokenizer_from_gguf_vocab(const GgufVocab& v, const std::string& where);

// The reverse direction (for convert): the tokenizer.ggml.* metadata that
// llama.cpp's converter writes for a Hugging Face tokenizer.json (+ optional
// tokenizer_config.json). SentencePiece-style BPE (byte fallback, "▁"
// metaspace; Llama 2 / Mistral) becomes model "llama" with scores = -rank
// order as llama.cpp's converter derives them; byte-level BPE becomes "gpt2"
// with its merges and a `pre` recognised from the split regex.
GgufVocab gguf_vocab_from_hf(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                             const std::string& where);

}  // namespace ptllm
