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
  // `how`: map the weight files or read them into memory (io/mmap.h).
  static std::unique_ptr<Model> load_hf(const std::string& dir, FileLoad how = FileLoad::Map);
  // Loads a .tinygpt file (model/tinygpt.cc); the embedded tokenizer.json, if
  // any, is returned through tokenizer_json.
  static std::unique_ptr<Model> load_tinygpt(const std::string& path, std::string* tokenizer_json,
                                             FileLoad how = FileLoad::Map);
  // `--weights`: the same model with every 2-D weight re-encoded as `type` (a
  // block type, F16, BF16 or F32), row by row as `convert --type` encodes it
  // (matrix_storage_type: F16 where a row is not whole blocks), so the logits
  // equal those of the GGUF file `convert --type` writes. Weights already of
  // that type are kept as they are; 1-D tensors (norms, biases) too. Consumes m.
  // relay: results of a type with a 16-row layout that pays are re-laid
  // (load_gguf_model).
  static std::unique_ptr<Model> with_weight_type(std::unique_ptr<Model> m, DType type, bool relay = false);
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

  // One decode step of B independent sequences: tokens[b] is appended to
  // *caches[b] (each its own cache, at its own position) and logits[b] gets
  // that sequence's [vocab]; logits is [B, vocab]. Embeddings, norms,
  // projections and the MLP run as one matrix product over the B rows (each
  // weight read once), attention per sequence over its own cache. A row's
  // logits are bit-identical to forward() of that token alone (batch invariance:
  // ops::matmul_rows keeps the decode arithmetic per row).
  void forward_batch(const int32_t* tokens, int64_t B, KVCache* const* caches, float* logits) const;

  // Prompts of B sequences in one pass: sequence b runs counts[b] >= 1 tokens (tokens
  // holds them one sequence after another) into *caches[b], and logits[b] gets the
  // [vocab] of its last token; logits is [B, vocab]. As in forward_batch, the
  // projections and the MLP are one product over all the rows (each weight read once,
  // each row with the one-token decode arithmetic, ops::matmul_rows) and attention runs
  // per sequence over its own cache, with its counts[b] queries causal among
  // themselves. So a sequence's logits and cache are bit-identical to forward_prompts
  // of that sequence alone, whatever it shares the call with (batch invariance), and
  // agree with forward() to rounding (forward() may take the blocked GEMM). Each
  // counts[b] must fit in caches[b]->room(). Device caches: each sequence through its
  // own forward().
  void forward_prompts(const int32_t* tokens, const int64_t* counts, int64_t B, KVCache* const* caches,
                       float* logits) const;

  // Bytes of weights one decode step reads: every weight except the embedding
  // table, of which only one row, unless the table is also the (tied) output head.
  size_t step_weight_bytes() const;

  // Shape of the cache this model needs.
  KVCacheShape cache_shape(int64_t capacity) const;

 private:
  const TensorView& tensor(const std::string& name, std::vector<int64_t> shape) const;
  // The forward pass of n rows: one sequence of n tokens (n_caches = 1, counts null),
  // n sequences of one token each (n_caches = n, counts null), or n_caches sequences of
  // counts[b] tokens each (summing to n). The last two take the rows kernels
  // (ops::matmul_rows); with counts, logits are each sequence's last row.
  void run(const int32_t* tokens, int64_t n, KVCache* const* caches, int64_t n_caches, float* logits,
           bool all_logits, const int64_t* counts = nullptr) const;
  ModelConfig config_;
  TensorStore store_;
  std::string source_;
  TensorView embed_, final_norm_, lm_head_;
  TensorView yoco_kv_norm_, yoco_wk_, yoco_wv_;  // YOCO global K/V projection
  std::vector<LayerWeights> layers_;
};

}  // namespace ptllm
