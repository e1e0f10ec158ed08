// Reference caches and attention used only by tests: the plain fp32 cache
// (keys rotated at their absolute position, nothing ever evicted) and the
// straightforward attention loops that StorageKVCache is checked against.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_cache.h"

namespace ptllm {

// Full-precision cache holding every token up to `capacity`. Keys are stored
// already rotated at their absolute position.
class Fp32KVCache : public KVCache {
 public:
  explicit Fp32KVCache(const KVCacheShape& shape);
  void append(int64_t layer, const float* k, const float* v, int64_t n) override;
  void attend(int64_t layer, const float* q, int64_t n, float* out) override;
  int64_t stored(int64_t layer) const override { return len_[size_t(layer)]; }
  int64_t room() const override;
  size_t payload_bytes() const override;
  std::string describe() const override { return "fp32 cache (unbounded up to the context length)"; }
  void clear() override;

 private:
  // Per layer: [n_kv_heads, capacity, head_dim]; only the first len_ slots are valid.
  std::vector<std::vector<float>> k_, v_;
  std::vector<int64_t> len_;
};

// Reference attention (Fp32KVCache and the tests' own recomputations): q [n_heads, head_dim] at query
// position `q_pos` over keys/values in fp32 [n_kv_heads, stride, head_dim] whose
// positions are key_pos[0..len). Keys must already be rotated.
void attend_fp32(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const float* k,
                 const float* v, int64_t stride, const int64_t* key_pos, int64_t len, int64_t q_pos,
                 int64_t sliding_window, float* out);

// Attention of one query head over fp32 keys (already rotated) and values,
// both [len, head_dim]; slot t is visible when key_pos[t] is within the
// model's window of q_pos (window 0 = none). scores: scratch of len floats.
// Only fp32 pointers are accepted: quantised codes cannot reach the softmax.
void attend_head(const float* q, const float* k, const float* v, int64_t len, int64_t head_dim,
                 const int64_t* key_pos, int64_t q_pos, int64_t window, float* scores, float* out);

}  // namespace ptllm
