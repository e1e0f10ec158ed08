// Storage of one layer's keys or values: [n_heads, slots, head_dim] in some
// precision. The cache (kv_cache.h) owns two stores per layer and decides what
// goes in (rotated or not) and what is evicted; a store only knows how to hold
// rows, drop a slot range, and hand a head back as fp32.
//
// Attention only ever receives fp32 rows from read()/fp32_rows(): integer codes
// never leave a store. A grouped KIVI scheme (scales per group of G tokens plus
// a full-precision residual window) is one more KVStore implementation; the
// cache and attention do not change.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/quant.h"

namespace ptllm {

enum class KVStorage;  // cache_options.h
struct CacheOptions;

class KVStore {
 public:
  KVStore(int64_t n_heads, int64_t capacity, int64_t head_dim)
      : n_heads_(n_heads), capacity_(capacity), head_dim_(head_dim) {}
  virtual ~KVStore() = default;

  // Appends n rows per head. x: [n, n_heads, head_dim] (fp32). size()+n <= capacity.
  virtual void append(const float* x, int64_t n) = 0;
  // Removes slots [begin, end); later slots move down.
  virtual void evict(int64_t begin, int64_t end) = 0;
  // All stored rows of `head` as fp32: out [size(), head_dim].
  virtual void read(int64_t head, float* out) const = 0;
  // The rows of `head` in place when they are stored as fp32 (no copy), else nullptr.
  virtual const float* fp32_rows(int64_t head) const { return nullptr; }
  // Bytes of live payload (codes / values of stored rows) and of scales+zeros.
  virtual size_t payload_bytes() const = 0;
  virtual size_t scale_bytes() const { return 0; }

  int64_t size() const { return len_; }
  int64_t capacity() const { return capacity_; }
  int64_t n_heads() const { return n_heads_; }
  int64_t head_dim() const { return head_dim_; }
  virtual void clear() { len_ = 0; }

 protected:
  int64_t n_heads_, capacity_, head_dim_;
  int64_t len_ = 0;
};

// K store for `storage`: plain casts for fp32/fp16/bf16, KIVI per-channel (simple scheme) for int8/int4/int2.
std::unique_ptr<KVStore> make_key_store(KVStorage storage, int64_t n_heads, int64_t capacity, int64_t head_dim);
// V store: plain casts, or KIVI per-token for int8/int4/int2.
std::unique_ptr<KVStore> make_value_store(KVStorage storage, int64_t n_heads, int64_t capacity, int64_t head_dim);

// The store the cache uses for K (key = true) or V of one layer under `o`:
// o.k_storage() / o.v_storage(); quantised ones grouped (grouped_store.h) when
// o.kivi_group > 0, with o.sink full-precision sinks when `sink` says so.
std::unique_ptr<KVStore> make_store(bool key, const CacheOptions& o, int64_t sink, int64_t n_heads, int64_t capacity,
                                    int64_t head_dim);

// KIVI keys: one (scale, zero) per (head, channel) over all stored tokens,
// recomputed on every append (dequantise, append, re-quantise). Codes are
// [n_heads, capacity, row_bytes]; params [n_heads, head_dim].
class KiviKeyStore : public KVStore {
 public:
  KiviKeyStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim);
  void append(const float* x, int64_t n) override;
  void evict(int64_t begin, int64_t end) override;
  void read(int64_t head, float* out) const override;
  size_t payload_bytes() const override;
  size_t scale_bytes() const override;
  const kivi::AffineParams& params(int64_t head, int64_t channel) const {
    return params_[size_t(head * head_dim_ + channel)];
  }

 private:
  kivi::QuantRange r_;
  size_t row_;  // bytes per packed row
  std::vector<uint8_t> codes_;
  std::vector<kivi::AffineParams> params_;
};

// KIVI values: one (scale, zero) per (head, token) over the channels. Codes
// [n_heads, capacity, row_bytes]; params [n_heads, capacity].
class KiviValueStore : public KVStore {
 public:
  KiviValueStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim);
  void append(const float* x, int64_t n) override;
  void evict(int64_t begin, int64_t end) override;
  void read(int64_t head, float* out) const override;
  size_t payload_bytes() const override;
  size_t scale_bytes() const override;
  const kivi::AffineParams& params(int64_t head, int64_t slot) const {
    return params_[size_t(head * capacity_ + slot)];
  }

 private:
  kivi::QuantRange r_;
  size_t row_;
  std::vector<uint8_t> codes_;
  std::vector<kivi::AffineParams> params_;
};

}  // namespace ptllm
