// The KV cache interface the forward pass talks to. (The one implementation
// is StorageKVCache, storage_cache.h; tests/kv/reference_cache.h holds the
// fp32 reference cache the tests compare it with.)
//
// The model hands the cache *pre-RoPE* keys and queries: the cache decides
// where rotation happens (at append for absolute positions, at read time when
// StreamingLLM re-positions keys by slot). Attention is computed by the cache
// because only it knows how K/V are stored (fp32, fp16, quantised...).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/rope.h"

namespace ptllm {

struct KVCacheShape {
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // K/V heads (GQA: n_heads % n_kv_heads == 0)
  int64_t head_dim = 0;
  int64_t capacity = 0;        // most tokens one layer may hold
  int64_t sliding_window = 0;  // model's own attention window (Mistral), 0 = none
  // Per cache layer window overriding sliding_window (YOCO self-decoder layers
  // have one, its global K/V layer none); empty = sliding_window for every layer.
  std::vector<int64_t> layer_window;
  RopeConfig rope;

  int64_t window_of(int64_t layer) const {
    return layer < int64_t(layer_window.size()) ? layer_window[size_t(layer)] : sliding_window;
  }
};

class KVCache {
 public:
  explicit KVCache(const KVCacheShape& shape) : shape_(shape), rope_(shape.rope, shape.head_dim) {}
  virtual ~KVCache() = default;

  // Stores n new tokens' K/V for `layer` at positions position() .. position()+n-1.
  // k, v: [n, n_kv_heads, head_dim], k not yet rotated.
  virtual void append(int64_t layer, const float* k, const float* v, int64_t n) = 0;
  // Causal attention for the n tokens just appended to `layer`:
  // q [n, n_heads, head_dim] (not yet rotated) -> out [n, n_heads, head_dim].
  virtual void attend(int64_t layer, const float* q, int64_t n, float* out) = 0;
  // Called once all layers have processed the n tokens of this step.
  virtual void advance(int64_t n) { position_ += n; }
  // Tokens currently held by `layer`.
  virtual int64_t stored(int64_t layer) const = 0;
  // How many more tokens can be appended in one step. A bounded (evicting)
  // cache returns its free slots but at least 1: once full it takes one token
  // per step and evicts to make room (a chunk must not evict tokens that
  // earlier queries of the same chunk still attend to).
  virtual int64_t room() const = 0;
  virtual bool bounded() const { return false; }
  // Bytes held for K/V payload and for quantisation scales/zeros.
  virtual size_t payload_bytes() const = 0;
  virtual size_t scale_bytes() const { return 0; }
  virtual std::string describe() const = 0;
  virtual void clear() { position_ = 0; }
  // Makes all of the cache's storage resident now instead of page by page as
  // tokens arrive (KVStore::populate); a no-op where there is nothing to do.
  virtual void populate() {}

  int64_t position() const { return position_; }  // tokens seen so far (monotonic)
  const KVCacheShape& shape() const { return shape_; }
  const Rope& rope() const { return rope_; }

 protected:
  KVCacheShape shape_;
  Rope rope_;
  int64_t position_ = 0;
};

}  // namespace ptllm
