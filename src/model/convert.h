// Conversion between Hugging Face Llama-family folders and .tinygpt files.
#pragma once
#include <optional>
#include <string>

#include "core/dtype.h"

namespace ptllm {

// HF folder -> .tinygpt (tokenizer.json embedded when present). dtype: convert
// every tensor to it; nullopt keeps each tensor's stored dtype (bit-exact).
void convert_hf_to_tinygpt(const std::string& hf_dir, const std::string& out_path, std::optional<DType> dtype);
// .tinygpt -> HF folder (config.json, generation_config.json, model.safetensors, tokenizer.json).
class Model;
// The model as a Hugging Face folder (config.json, generation_config.json,
// model.safetensors, and tokenizer.json when given): what transformers loads.
// Tensors keep their dtype, or `dtype` (f32/f16/bf16); block-quantised ones are
// decoded (to f32 unless `dtype`).
void write_hf_folder(const Model& model, const std::string& out_dir, std::optional<DType> dtype,
                     const std::string& tokenizer_json = "");
void convert_tinygpt_to_hf(const std::string& tinygpt_path, const std::string& out_dir, std::optional<DType> dtype);

}  // namespace ptllm
