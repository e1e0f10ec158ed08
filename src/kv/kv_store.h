// Storage of one layer's keys or values: [n_heads, slots, head_dim] in some
// precision. The cache (storage_cache.h) owns two stores per layer and decides
// what goes in (rotated or not) and what is evicted; a store knows how to hold
// rows, drop a slot range, hand a head back as fp32, and take part in
// attention through one interface (key_scores / value_sum), so the cache has a
// single attention path whatever the storage.
//
// Attention only ever receives fp32 scores and sums: integer codes never leave
// a store (grouped KIVI stores call the fused kernels of ops/kivi_kernels.h,
// which produce fp32 from the codes; stores that cannot be read in place are
// read back as fp32 first).
//
// Eviction is O(1): StreamingLLM drops the oldest non-sink slot every step, so
// stores keep their non-sink rows in a ring (RowRing) and evicting only moves
// the ring's start. Slots stay in logical order (sinks first, then oldest to
// newest); a slot range maps to at most three physically contiguous pieces.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/memory.h"
#include "core/uninit_vector.h"
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

  // ---- attention: StorageKVCache::attend calls these per (query, head, run of slots) ----
  // True when attention reads the store where it is (fp32 rows, grouped KIVI
  // codes). Otherwise the cache reads each head back with read() once per
  // attend() (rotating pre-RoPE keys by slot) into `staged` [capacity,
  // head_dim] and passes it to the calls below, which then read that.
  virtual bool reads_in_place() const { return false; }
  // K: scores[t] = scale * q . k_t for slots t in [begin, end). Pre-RoPE
  // (quantised) keys are turned by slot t's row of kcos/ksin ([>= end,
  // head_dim/2], from slot 0); keys stored rotated do not use them.
  virtual void key_scores(int64_t head, const float* staged, const float* q, int64_t begin, int64_t end,
                          const float* kcos, const float* ksin, float scale, float* scores) const;
  // V: out[head_dim] = sum over slots t < len of p[t] v_t (p[t] == 0: skipped).
  virtual void value_sum(int64_t head, const float* staged, const float* p, int64_t len, float* out) const;
  // value_sum(head, staged, p[j], len[j], out[j]) for j < m <= ops::kMultiQueries,
  // with identical results. p[j] has max(len) entries, 0 past len[j]. The
  // default calls value_sum per query; fp32/fp16/bf16 rows share each row's
  // loads among the queries (ops::weighted_sum_rows_multi).
  virtual void value_sum_multi(int64_t head, const float* staged, const float* const* p, const int64_t* len, int m,
                               float* const* out) const;
  // value_sum(head[j], staged[j], p[j], len, out[j]) for j < m <= ops::kMultiQueries:
  // one query's heads of different KV heads (a decode step), with identical
  // results. The default calls value_sum per head; fp32/fp16/bf16 rows
  // interleave the heads' sums (ops::weighted_sum_rows_heads).
  virtual void value_sum_heads(const int64_t* head, const float* const* staged, const float* const* p, int64_t len,
                               int m, float* const* out) const;

  // Bytes of live payload (codes / values of stored rows) and of scales+zeros.
  virtual size_t payload_bytes() const = 0;
  virtual size_t scale_bytes() const { return 0; }

  int64_t size() const { return len_; }
  int64_t capacity() const { return capacity_; }
  int64_t n_heads() const { return n_heads_; }
  int64_t head_dim() const { return head_dim_; }
  virtual void clear() { len_ = 0; }
  // Makes the whole capacity's storage resident now (populate_pages), so that
  // appends never page-fault: the server does this when it admits a request,
  // whose reservation already counts the full capacity. Other users leave the
  // pages to fault in as rows arrive (an unbounded cache may never fill).
  virtual void populate() {}

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

// What the two simple (ungrouped) KIVI stores share: packed codes
// [n_heads, capacity, row_bytes] and n_params (scale, zero) pairs.
class KiviCodeStore : public KVStore {
 public:
  size_t payload_bytes() const override { return size_t(len_ * n_heads_) * row_; }
  void populate() override { populate_pages(codes_.data(), codes_.size()); }

 protected:
  KiviCodeStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim, size_t n_params);
  // Slides code rows [end, len) of every head down to `begin`.
  void evict_codes(int64_t begin, int64_t end);

  kivi::QuantRange r_;
  size_t row_;  // bytes per packed row
  uninit_vector<uint8_t> codes_;  // rows past len_ never read
  std::vector<kivi::AffineParams> params_;
};

// KIVI keys: one (scale, zero) per (head, channel) over all stored tokens,
// recomputed on every append (dequantise, append, re-quantise). Params
// [n_heads, head_dim].
class KiviKeyStore : public KiviCodeStore {
 public:
  KiviKeyStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim);
  void append(const float* x, int64_t n) override;
  void evict(int64_t begin, int64_t end) override;
  void read(int64_t head, float* out) const override;
  size_t scale_bytes() const override;
  const kivi::AffineParams& params(int64_t head, int64_t channel) const {
    return params_[size_t(head * head_dim_ + channel)];
  }
};

// KIVI values: one (scale, zero) per (head, token) over the channels. Params
// [n_heads, capacity].
class KiviValueStore : public KiviCodeStore {
 public:
  KiviValueStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim);
  void append(const float* x, int64_t n) override;
  void evict(int64_t begin, int64_t end) override;
  void read(int64_t head, float* out) const override;
  size_t scale_bytes() const override;
  const kivi::AffineParams& params(int64_t head, int64_t slot) const {
    return params_[size_t(head * capacity_ + slot)];
  }
};

}  // namespace ptllm
