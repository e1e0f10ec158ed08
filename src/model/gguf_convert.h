// Conversion to and from GGUF, and the metadata llama.cpp's loader reads.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "core/dtype.h"
#include "io/gguf.h"
#include "model/config.h"

namespace ptllm {

struct GgufConvertOptions {
  // Storage of every 2-D weight (F32, F16, BF16 or a block type); norms and
  // rope_freqs stay F32, as llama.cpp keeps them. A weight whose row length is
  // not a multiple of the block size falls back to F16.
  DType type = DType::F16;
  // Writes the tokenizer.ggml.* keys from the source's tokenizer.json text (the
  // folder's file, or the one a .tinygpt embeds; empty when it has none). The
  // tokenizer library owns that conversion (write_gguf_tokenizer) and model may
  // not depend on it, so the caller supplies it. Required.
  std::function<void(GgufWriter&, const std::string& tokenizer_json)> write_tokenizer;
};

// HF folder or (plain) .tinygpt -> GGUF v3, architecture `llama` (`qwen2` for
// Qwen2), llama's wq/wk rows permuted the GGUF way, tensors streamed to disk.
void convert_to_gguf(const std::string& in, const std::string& out_path, const GgufConvertOptions& opt);
// GGUF -> HF folder (config.json, generation_config.json, model.safetensors);
// rows un-permuted; block-quantised tensors dequantised to `dtype` (default F32),
// others kept unless `dtype` is given.
void convert_gguf_to_hf(const std::string& in, const std::string& out_dir, std::optional<DType> dtype);

// general.* and {arch}.* keys for a config, named as llama.cpp's converter names them.
void write_gguf_model_metadata(GgufWriter& w, const ModelConfig& c, const std::string& name, DType type);
// "f16", "q4_k", ... -> DType; `flag` names the option in the error.
DType parse_gguf_type(const std::string& s, const std::string& flag);
// What a 2-D weight of `cols` columns is stored as when `requested` is asked
// for: `requested`, or F16 when a row is not whole blocks of it. The one rule
// for `convert --type` and `--weights` (Model::with_weight_type).
DType matrix_storage_type(int64_t cols, DType requested);
// llama.cpp's general.file_type (LLAMA_FTYPE) for a weight type.
uint32_t gguf_file_type(DType type);
// A minimal SentencePiece-style vocabulary that every GGUF reader accepts:
// <unk>, <s>, </s>, the 256 byte tokens <0x00>.., then placeholders up to vocab_size.
void write_gguf_byte_tokenizer(GgufWriter& w, int64_t vocab_size);

// Encodes rows [row0, row0 + n_rows) of `src` ([rows, cols], F32/F16/BF16) as
// `type` into out (n_rows * storage_bytes(type, cols) bytes). row_of maps an
// output row to its source row (identity when null).
void encode_rows(const TensorView& src, int64_t row0, int64_t n_rows, DType type, std::byte* out,
                 const std::function<int64_t(int64_t)>& row_of = nullptr);

}  // namespace ptllm
