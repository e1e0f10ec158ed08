// A decoder-only transformer of the Llama family (Llama, Mistral, Qwen2):
// weights as views into memory-mapped files, and the forward pass.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "kv/kv_cache.h"
#include "model/config.h"

namespace ptllm {

struct LayerWeights {
  TensorView attn_norm;       // [hidden]
  TensorView wq, wk, wv, wo;  // [n_heads*hd, hidden], [n_kv*hd, hidden] x2, [hidden, n_heads*hd]
  TensorView bq, bk, bv;      // biases (Qwen2), empty when absent
  TensorView ffn_norm;        // [hidden]
  TensorView w_gate, w_up;    // [ffn, hidden]
  TensorView w_down;          // [hidden, ffn]
  bool has_bias = false;
  bool has_kv = true;        // false for YOCO cross-decoder layers (no wk/wv)
  int64_t cache_layer = 0;   // which cache layer this layer's attention reads
};

class Model {
 public:
  // Loads a Hugging Face folder (config.json + safetensors). Throws Error.
  static std::unique_ptr<Model> load_hf(const std::string& dir);
  // Loads a .tinygpt file (model/tinygpt.cc); the embedded tokenizer.json, if
  // any, is returned through tokenizer_json.
  static std::unique_ptr<Model> load_tinygpt(const std::string& path, std::string* tokenizer_json);
  // Builds from an already-parsed config and a tensor store using HF tensor names.
  Model(ModelConfig config, TensorStore store, std::string source);

  const ModelConfig& config() const { return config_; }
  const std::string& source() const { return source_; }
  const TensorStore& tensors() const { return store_; }
  size_t weight_bytes() const;

  // Runs tokens[0..n) at positions cache.position().. through every layer,
  // appending their K/V to `cache` and advancing it. Writes logits [n, vocab]
  // when all_logits, else only the last token's [vocab].
  void forward(const int32_t* tokens, int64_t n, KVCache& cache, float* logits, bool all_logits) const;

  // Shape of the cache this model needs.
  KVCacheShape cache_shape(int64_t capacity) const;

 private:
  const TensorView& tensor(const std::string& name, std::vector<int64_t> shape) const;
  ModelConfig config_;
  TensorStore store_;
  std::string source_;
  TensorView embed_, final_norm_, lm_head_;
  TensorView yoco_kv_norm_, yoco_wk_, yoco_wv_;  // YOCO global K/V projection
  std::vector<LayerWeights> layers_;
};

}  // namespace ptllm
