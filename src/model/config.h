// Architecture hyper-parameters, read from a Hugging Face config.json in the
// transformers 4 style (rope_theta / rope_scaling) or the transformers 5 style
// (rope_parameters).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/rope.h"

namespace ptllm {

enum class Family { Llama, Mistral, Qwen2, TinyGpt };


struct ModelConfig {
  Family family = Family::Llama;
  std::string model_type;  // as written in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position = 0;   // context length the model was trained for
  int64_t sliding_window = 0;  // 0 = full causal attention
  double rms_eps = 1e-6;
  bool tie_embeddings = false;
  bool qkv_bias = false;
  RopeConfig rope;
  // YOCO (.tinygpt): layers [0, yoco_self_layers) keep their own K/V, one
  // global K/V is computed after them, later layers attend to it. 0 = plain.
  int64_t yoco_self_layers = 0;
  int64_t yoco_self_window = 0;  // sliding window of the self-decoder layers, 0 = none
  bool yoco() const { return yoco_self_layers > 0; }
  // Layers that store K/V: S + 1 for YOCO, else n_layers.
  int64_t n_cache_layers() const { return yoco() ? yoco_self_layers + 1 : n_layers; }
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;

  std::string summary() const;
};

// Parses config.json text; `where` names the file in error messages.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& where);
// Reads dir/config.json, then dir/generation_config.json for BOS/EOS if present.
ModelConfig load_hf_config(const std::string& dir);
// Parses the "config" metadata of a .tinygpt file.
ModelConfig parse_tinygpt_config(const std::string& json_text, const std::string& where);

}  // namespace ptllm
