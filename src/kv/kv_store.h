// Storage of one layer's keys or values: [n_heads, slots, head_dim] in some
// precision. The cache (kv_cache.h) owns two stores per layer and decides what
// goes in (rotated or not) and what is evicted; a store only knows how to hold
// rows, drop a slot range, and hand a head back as fp32.
//
// Attention only ever receives fp32 rows from read()/fp32_pieces(): integer
// codes never leave a store (grouped KIVI codes are read by fused kernels that
// produce fp32 scores and sums, grouped_store.h).
//
// Eviction is O(1): StreamingLLM drops the oldest non-sink slot every step, so
// stores keep their non-sink rows in a ring (RowRing) and evicting only moves
// the ring's start. Slots stay in logical order (sinks first, then oldest to
// newest); a slot range maps to at most three physically contiguous pieces. A grouped KIVI scheme (scales per group of G tokens plus
// a full-precision residual window) is one more KVStore implementation; the
// cache and attention do not change.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/quant.h"

namespace ptllm {

enum class KVStorage;  // cache_spec.h
struct CacheSpec;

// A ring of `cap` rows: logical row j (0 = oldest) is at physical row
// (start + j) mod cap. Dropping the oldest rows moves `start`; nothing is copied.
struct RowRing {
  int64_t cap = 0, start = 0, count = 0;
  int64_t phys(int64_t j) const {
    const int64_t p = start + j;
    return p >= cap ? p - cap : p;
  }
  int64_t push_back() { return phys(count++); }  // physical row of the new newest row
  void pop_front(int64_t k) {
    start = count == k ? 0 : phys(k);
    count -= k;
  }
  void clear() { start = count = 0; }
};

// Logical slots [slot, slot + n) stored at physical rows [row, row + n).
struct SlotPiece {
  int64_t slot = 0, row = 0, n = 0;
};

class KVStore {
 public:
  KVStore(int64_t n_heads, int64_t capacity, int64_t head_dim)
      : n_heads_(n_heads), capacity_(capacity), head_dim_(head_dim) {}
  virtual ~KVStore() = default;

  // Appends n rows per head. x: [n, n_heads, head_dim] (fp32). size()+n <= capacity.
  virtual void append(const float* x, int64_t n) = 0;
  // Removes slots [begin, end); later slots move down. Plain and grouped
  // stores take only the oldest non-sink slots (begin == their sink count).
  virtual void evict(int64_t begin, int64_t end) = 0;
  // All stored rows of `head` as fp32: out [size(), head_dim].
  virtual void read(int64_t head, float* out) const = 0;
  // fp32 stores: the rows of `head` in place (no copy), [capacity, head_dim],
  // else nullptr. Logical slots map to its rows through pieces().
  virtual const float* fp32_base(int64_t head) const { return nullptr; }
  // Slots [begin, end) as physically contiguous pieces of fp32_base() rows,
  // in slot order (at most 3: fixed sinks, ring tail, ring head). Returns the count.
  virtual int pieces(int64_t begin, int64_t end, SlotPiece* out) const {
    out[0] = {begin, begin, end - begin};
    return end > begin ? 1 : 0;
  }
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
// Plain stores keep the first `sink` slots fixed and the rest in a ring (O(1) eviction of slot `sink`).
std::unique_ptr<KVStore> make_key_store(KVStorage storage, int64_t n_heads, int64_t capacity, int64_t head_dim,
                                        int64_t sink = 0);
// V store: plain casts, or KIVI per-token for int8/int4/int2.
std::unique_ptr<KVStore> make_value_store(KVStorage storage, int64_t n_heads, int64_t capacity, int64_t head_dim,
                                          int64_t sink = 0);

// The store the cache uses for K (key = true) or V of one layer under `o`:
// o.k_storage() / o.v_storage(); quantised ones grouped (grouped_store.h) when
// o.kivi_group > 0, with o.sink full-precision sinks when `sink` says so.
std::unique_ptr<KVStore> make_store(bool key, const CacheSpec& o, int64_t sink, int64_t n_heads, int64_t capacity,
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
