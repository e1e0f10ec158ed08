#include "model/model.h"

#include <fmt/format.h>

#include <cmath>
#include <exception>

#include "core/error.h"
#include "model/device_cache.h"
#include "ops/ops.h"

namespace ptllm {

std::unique_ptr<Model> Model::load_hf(const std::string& dir, FileLoad how) {
  ModelConfig cfg = load_hf_config(dir);
  TensorStore store = TensorStore::open_hf_dir(dir, how);
  return std::make_unique<Model>(std::move(cfg), std::move(store), dir);
}

const TensorView& Model::tensor(const std::string& name, std::vector<int64_t> shape) const {
  if (!store_.has(name)) fail("{}: missing tensor {}", source_, name);
  const TensorView& t = store_.get(name);
  if (t.shape != shape)
    fail("{}: tensor {} has shape {}, expected {}", store_.source_of(name), name, shape_str(t.shape),
         shape_str(shape));
  // Block-quantised (GGUF) weights: 2-D matrices only; ops::matmul and
  // ops::to_f32 (the embedding lookup) take them, norms and biases stay float.
  const bool block_ok = is_block_quantised(t.dtype) && shape.size() == 2;
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16 && !block_ok)
    fail("{}: tensor {} has dtype {} (supported: F32, F16, BF16; block types for 2-D weights)",
         store_.source_of(name), name, dtype_name(t.dtype));
  return t;
}

Model::Model(ModelConfig config, TensorStore store, std::string source)
    : config_(std::move(config)), store_(std::move(store)), source_(std::move(source)) {
  const auto& c = config_;
  const int64_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int64_t QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  embed_ = tensor("model.embed_tokens.weight", {V, H});
  final_norm_ = tensor("model.norm.weight", {H});
  if (c.tie_embeddings || !store_.has("lm_head.weight")) {
    if (!c.tie_embeddings) fail("{}: missing tensor lm_head.weight (and tie_word_embeddings is false)", source_);
    lm_head_ = embed_;
  } else {
    lm_head_ = tensor("lm_head.weight", {V, H});
  }
  if (c.yoco()) {
    if (c.yoco_self_layers >= c.n_layers) fail("{}: yoco.self_layers must be < n_layers", source_);
    yoco_kv_norm_ = tensor("yoco.kv_norm.weight", {H});
    yoco_wk_ = tensor("yoco.wk.weight", {KD, H});
    yoco_wv_ = tensor("yoco.wv.weight", {KD, H});
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights w;
    w.has_kv = !c.yoco() || l < c.yoco_self_layers;
    w.cache_layer = w.has_kv ? l : c.yoco_self_layers;
    w.attn_norm = tensor(p + "input_layernorm.weight", {H});
    w.wq = tensor(p + "self_attn.q_proj.weight", {QD, H});
    if (w.has_kv) {
      w.wk = tensor(p + "self_attn.k_proj.weight", {KD, H});
      w.wv = tensor(p + "self_attn.v_proj.weight", {KD, H});
    }
    w.wo = tensor(p + "self_attn.o_proj.weight", {H, QD});
    if (c.qkv_bias) {
      w.has_bias = true;
      w.bq = tensor(p + "self_attn.q_proj.bias", {QD});
      w.bk = tensor(p + "self_attn.k_proj.bias", {KD});
      w.bv = tensor(p + "self_attn.v_proj.bias", {KD});
    }
    w.ffn_norm = tensor(p + "post_attention_layernorm.weight", {H});
    w.w_gate = tensor(p + "mlp.gate_proj.weight", {F, H});
    w.w_up = tensor(p + "mlp.up_proj.weight", {F, H});
    w.w_down = tensor(p + "mlp.down_proj.weight", {H, F});
    layers_.push_back(std::move(w));
  }
}

size_t Model::weight_bytes() const {
  size_t n = 0;
  for (auto& [name, t] : store_.all()) n += t.nbytes();
  return n;
}

KVCacheShape Model::cache_shape(int64_t capacity) const {
  KVCacheShape s;
  s.n_layers = config_.n_cache_layers();
  s.n_heads = config_.n_heads;
  s.n_kv_heads = config_.n_kv_heads;
  s.head_dim = config_.head_dim;
  s.capacity = capacity;
  s.sliding_window = config_.sliding_window;
  if (config_.yoco()) {
    // Self-decoder layers may have a window; the global K/V layer has none.
    s.layer_window.assign(size_t(config_.yoco_self_layers), config_.yoco_self_window);
    s.layer_window.push_back(0);
  }
  s.rope = config_.rope;
  return s;
}

size_t Model::step_weight_bytes() const {
  size_t n = weight_bytes();
  if (lm_head_.data != embed_.data) n -= embed_.nbytes() - storage_bytes(embed_.dtype, size_t(embed_.cols()));
  return n;
}

void Model::forward(const int32_t* tokens, int64_t n, KVCache& cache, float* logits, bool all_logits) const {
  // A device cache runs the whole step on its accelerator (src/cuda).
  if (auto* d = dynamic_cast<DeviceKVCache*>(&cache)) return d->forward(tokens, n, logits, all_logits);
  KVCache* c = &cache;
  run(tokens, n, &c, 1, logits, all_logits);
}

// What forward_batch and forward_prompts require of their sequences: at least one, a cache
// of its own each, and room in it for its tokens (counts[b], or one each when counts is
// null). Returns the number of tokens in all.
static int64_t check_sequences(const char* what, int64_t B, KVCache* const* caches, const int64_t* counts) {
  if (B < 1) fail("{}: {} sequences (expected >= 1)", what, B);
  int64_t n = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (!caches[b]) fail("{}: sequence {} has no cache", what, b);
    for (int64_t a = 0; a < b; ++a)
      if (caches[a] == caches[b]) fail("{}: sequences {} and {} share one cache", what, a, b);
    const int64_t k = counts ? counts[b] : 1;
    if (k < 1) fail("{}: sequence {} has {} tokens (expected >= 1)", what, b, k);
    if (!counts && caches[b]->room() < 1) fail("{}: the cache of sequence {} is full", what, b);
    if (k > caches[b]->room())
      fail("{}: sequence {} has {} tokens but its cache has room for {}", what, b, k, caches[b]->room());
    n += k;
  }
  return n;
}

void Model::forward_batch(const int32_t* tokens, int64_t B, KVCache* const* caches, float* logits) const {
  check_sequences("forward_batch", B, caches, nullptr);
  if (auto* d = dynamic_cast<DeviceKVCache*>(caches[0])) return d->forward_batch(tokens, B, caches, logits);
  run(tokens, B, caches, B, logits, /*all_logits=*/true);
}

void Model::forward_prompts(const int32_t* tokens, const int64_t* counts, int64_t B, KVCache* const* caches,
                            float* logits) const {
  const int64_t n = check_sequences("forward_prompts", B, caches, counts);
  if (dynamic_cast<DeviceKVCache*>(caches[0])) {
    const int64_t V = config_.vocab_size;
    for (int64_t b = 0, at = 0; b < B; at += counts[b], ++b) forward(tokens + at, counts[b], *caches[b], logits + b * V, false);
    return;
  }
  run(tokens, n, caches, B, logits, /*all_logits=*/false, counts);
}

void Model::run(const int32_t* tokens, int64_t n, KVCache* const* caches, int64_t n_caches, float* logits,
                bool all_logits, const int64_t* counts) const {
  const auto& c = config_;
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t QD = c.n_heads * c.head_dim, KD = c.n_kv_heads * c.head_dim;
  // Several sequences (one token each, or counts[b] each): the rows kernels.
  const bool batch = n_caches > 1 || counts;
  // Sequence b's rows [first[b], first[b] + count(b)).
  std::vector<int64_t> first;
  if (counts) {
    first.resize(size_t(n_caches) + 1);
    for (int64_t b = 0; b < n_caches; ++b) first[size_t(b) + 1] = first[size_t(b)] + counts[b];
    if (first.back() != n) fail("forward_prompts: the counts add up to {} rows, not {}", first.back(), n);
  }
  const auto row0 = [&](int64_t b) { return counts ? first[size_t(b)] : b; };
  const auto count = [&](int64_t b) { return counts ? counts[b] : int64_t(1); };
  // Products over the n rows: one sequence's prefill may use the blocked GEMM;
  // a batch keeps each row's decode arithmetic (ops::matmul_rows).
  const auto matmul_multi = [&](const float* in, const ops::MatmulJob* jobs, int n_jobs) {
    batch ? ops::matmul_rows(in, n, jobs, n_jobs) : ops::matmul_multi(in, n, jobs, n_jobs);
  };
  const auto matmul = [&](const TensorView& w, const float* in, float* out) {
    const ops::MatmulJob job{&w, out, nullptr};
    matmul_multi(in, &job, 1);
  };
  // K/V of the n rows into their cache(s): k, v [n, KD].
  const auto append = [&](int64_t layer, const float* k, const float* v) {
    if (!batch) return caches[0]->append(layer, k, v, n);
    for (int64_t b = 0; b < n_caches; ++b)
      caches[b]->append(layer, k + row0(b) * KD, v + row0(b) * KD, count(b));
  };
  const auto attend = [&](int64_t layer, const float* q, float* out) {
    if (!batch) return caches[0]->attend(layer, q, n, out);
    // One parallel region over the sequences instead of one inside each
    // sequence's attend (a fork/join per sequence and layer: at 16 sequences
    // 192 per step, each a thread wake-up). Inside it a sequence's attention
    // runs on one thread (the nested region is inactive); its arithmetic per
    // (query, head) does not depend on the thread, so each sequence's output
    // stays bit-identical to stepping it alone. An exception may not leave an
    // OpenMP region: the first is kept and rethrown after it.
    std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1) if (n_caches > 1)
    for (int64_t b = 0; b < n_caches; ++b) {
      try {
        caches[b]->attend(layer, q + row0(b) * QD, count(b), out + row0(b) * QD);
      } catch (...) {
#pragma omp critical(ptllm_batch_attend_error)
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
  };
  // Activations in one per-thread workspace, reused across calls (decode calls
  // forward once per token; nine allocations each time showed up in profiles).
  thread_local std::vector<float> ws;
  ws.resize(size_t(n * (3 * H + 2 * QD + 2 * KD + 2 * F)));
  float* const x = ws.data();                              // [n, H] residual stream
  float* const xn = x + n * H;                             // [n, H] normed
  float* const proj = xn + n * H;                          // [n, H] o_proj / down_proj output
  float* const q = proj + n * H;                           // [n, QD]
  float* const att = q + n * QD;                           // [n, QD]
  float* const k = att + n * QD;                           // [n, KD]
  float* const v = k + n * KD;                             // [n, KD]
  float* const gate = v + n * KD;                          // [n, F]
  float* const up = gate + n * F;                          // [n, F]
  const size_t nH = size_t(n * H);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= c.vocab_size) fail("token id {} is outside the vocabulary (0..{})", id, c.vocab_size - 1);
    ops::row_to_f32(embed_, id, x + t * H);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[size_t(l)];
    if (c.yoco() && l == c.yoco_self_layers) {
      // YOCO: the one global K/V, computed from the self-decoder's output and
      // shared by every cross-decoder layer.
      ops::rmsnorm(x, yoco_kv_norm_, c.rms_eps, n, H, xn);
      const ops::MatmulJob kv[] = {{&yoco_wk_, k, nullptr}, {&yoco_wv_, v, nullptr}};
      matmul_multi(xn, kv, 2);
      append(w.cache_layer, k, v);
    }
    ops::rmsnorm(x, w.attn_norm, c.rms_eps, n, H, xn);
    // q, k, v in one parallel pass over their weights.
    const ops::MatmulJob qkv[] = {{&w.wq, q, w.has_bias ? &w.bq : nullptr},
                                  {&w.wk, k, w.has_bias ? &w.bk : nullptr},
                                  {&w.wv, v, w.has_bias ? &w.bv : nullptr}};
    matmul_multi(xn, qkv, w.has_kv ? 3 : 1);
    if (w.has_kv) append(w.cache_layer, k, v);
    attend(w.cache_layer, q, att);
    matmul(w.wo, att, proj);
    for (size_t i = 0; i < nH; ++i) x[i] += proj[i];
    ops::rmsnorm(x, w.ffn_norm, c.rms_eps, n, H, xn);
    // gate = silu(gate) * up
    batch ? ops::matmul_swiglu_rows(w.w_gate, w.w_up, xn, n, gate, up)
          : ops::matmul_swiglu(w.w_gate, w.w_up, xn, n, gate, up);
    matmul(w.w_down, gate, proj);
    for (size_t i = 0; i < nH; ++i) x[i] += proj[i];
  }
  for (int64_t b = 0; b < n_caches; ++b) caches[b]->advance(batch ? count(b) : n);
  if (counts) {
    // Each sequence's last row, normed and through the head as one product over the
    // sequences (row by row the one-token arithmetic, as the other products).
    for (int64_t b = 0; b < n_caches; ++b)
      ops::rmsnorm(x + (first[size_t(b) + 1] - 1) * H, final_norm_, c.rms_eps, 1, H, xn + b * H);
    const ops::MatmulJob head{&lm_head_, logits, nullptr};
    ops::matmul_rows(xn, n_caches, &head, 1);
  } else if (all_logits) {
    ops::rmsnorm(x, final_norm_, c.rms_eps, n, H, xn);
    matmul(lm_head_, xn, logits);
  } else {
    ops::rmsnorm(x + (n - 1) * H, final_norm_, c.rms_eps, 1, H, xn);
    ops::matmul(lm_head_, xn, 1, logits);
  }
}

}  // namespace ptllm
