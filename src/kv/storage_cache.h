// The cache behind every --kv-quantize / --streaming-llm-* setting: two
// KVStores per layer (K and V in fp32, fp16, bf16 or KIVI int8/int4/int2), an
// optional StreamingLLM bound (N sinks + last M tokens), and attention over
// what the stores hold.
//
// RoPE: with `reposition` (default) a query at slot s sees the key at slot t
// at distance s - t (positions 0..len-1 by slot); without eviction slot ==
// position, so an unbounded cache gives the exact absolute result. With
// `absolute` the distance is the original positions' difference. fp32/fp16/
// bf16 keys are stored rotated at their position; quantised keys are stored
// un-rotated (better per-channel statistics) and rotated by slot at read time;
// the query's rotation per run of slots makes up the difference (attend()).
// Eviction is O(1): stores keep their non-sink rows in rings (kv_store.h).
// Attention has one path for every storage: each store gives the scores of a
// query against a run of its slots and the weighted sum of its values
// (KVStore::key_scores / value_sum); grouped KIVI stores compute both straight
// from their codes.
#pragma once
#include <memory>
#include <vector>

#include "kv/cache_spec.h"
#include "kv/kv_store.h"
#include "kv/rotation.h"

namespace ptllm {

class StorageKVCache : public KVCache {
 public:
  // shape.capacity = slots per layer (make_cache sets it to N+M for StreamingLLM).
  StorageKVCache(const KVCacheShape& shape, const CacheSpec& o);
  void append(int64_t layer, const float* k, const float* v, int64_t n) override;
  void attend(int64_t layer, const float* q, int64_t n, float* out) override;
  int64_t stored(int64_t layer) const override { return k_[size_t(layer)]->size(); }
  int64_t room() const override;
  bool bounded() const override { return opt_.streaming(); }
  size_t payload_bytes() const override;
  size_t scale_bytes() const override;
  std::string describe() const override;
  void clear() override;
  void populate() override;

  const CacheSpec& options() const { return opt_; }
  // Stored keys/values of (layer, kv head) as fp32 [stored, head_dim], as
  // stored: plain keys rotated at their position, quantised keys un-rotated
  // (dequantised), keys_prerope() says which; under rotate hadamard keys and
  // values are also turned by rotation(). For tests.
  std::vector<float> read_keys(int64_t layer, int64_t head) const;
  std::vector<float> read_values(int64_t layer, int64_t head) const;
  // Absolute position of each stored slot of `layer`.
  const std::vector<int64_t>& slot_positions(int64_t layer) const { return pos_[size_t(layer)]; }

 private:
  CacheSpec opt_;
  std::vector<std::unique_ptr<KVStore>> k_, v_;  // per layer
  // Keys stored before RoPE (quantised K) and rotated by slot at read time.
  bool keys_prerope_ = true;
  std::vector<std::vector<int64_t>> pos_;        // per layer: absolute position of each slot
  // Pre-RoPE keys: cos/sin of slots 0..n-1, [n, head_dim/2] each, grown on
  // demand up to the capacity, so decoding does no sincos per key.
  std::vector<float> cos_, sin_;
  void ensure_slot_table(int64_t len);
  // fp32 read-back of one layer's K and V for stores that are not read in
  // place, [n_kv_heads, capacity, head_dim] each.
  uninit_vector<float> kbuf_, vbuf_;  // rows past the stored length never read
  // rotate hadamard: one rotation per (layer, KV head), [n_layers * n_kv_heads]; empty otherwise.
  std::vector<HadamardRotation> rot_;

 public:
  // The rotation M of (layer, KV head) under rotate hadamard, else null.
  const HadamardRotation* rotation(int64_t layer, int64_t kv_head) const {
    return rot_.empty() ? nullptr : &rot_[size_t(layer * shape_.n_kv_heads + kv_head)];
  }
  // True when keys are stored before RoPE (grouped/simple KIVI per channel,
  // no rotation); otherwise stored rotated at their position (then by M).
  bool keys_prerope() const { return keys_prerope_; }
};

}  // namespace ptllm
