#include "kv/kv_store.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/uninit_vector.h"
#include "kv/cache_spec.h"
#include "kv/grouped_store.h"
#include "ops/ops.h"

namespace ptllm {
namespace {

// Logical slots [slot, slot + n) stored at physical rows [row, row + n).
struct SlotPiece {
  int64_t slot = 0, row = 0, n = 0;
};

// fp32 / fp16 / bf16 rows: a plain cast of each value. Elem is float or uint16_t.
// Per head, rows [0, sink) hold the sinks (never evicted); the other rows are
// a RowRing, so StreamingLLM's eviction of the oldest non-sink slot is O(1).
template <typename Elem, DType D>
class PlainStore : public KVStore {
 public:
  PlainStore(int64_t n_heads, int64_t capacity, int64_t head_dim, int64_t sink)
      : KVStore(n_heads, capacity, head_dim),
        sink_cap_(std::min(sink, capacity)),
        data_(static_cast<size_t>(n_heads * capacity * head_dim)) {
    ring_.cap = capacity - sink_cap_;
  }
  void populate() override { populate_pages(data_.data(), data_.size() * sizeof(Elem)); }

  void append(const float* x, int64_t n) override {
    if (len_ + n > capacity_) fail("KV store: {} stored + {} new > capacity {}", len_, n, capacity_);
    const int64_t hd = head_dim_;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = len_ < sink_cap_ ? len_ : sink_cap_ + ring_.push_back();
      for (int64_t h = 0; h < n_heads_; ++h) {
        const float* src = x + (t * n_heads_ + h) * hd;
        Elem* dst = data_.data() + (h * capacity_ + row) * hd;
        for (int64_t i = 0; i < hd; ++i) dst[i] = encode(src[i]);
      }
      ++len_;
    }
  }
  void evict(int64_t begin, int64_t end) override {
    if (begin < 0 || end < begin || end > len_) fail("KV store: evict [{}, {}) of {} slots", begin, end, len_);
    if (begin == end) return;
    // The cache only ever drops the oldest non-sink slots: move the ring's start.
    if (begin != sink_cap_)
      fail("KV store: evict [{}, {}) must start at the first non-sink slot {}", begin, end, sink_cap_);
    ring_.pop_front(end - begin);
    len_ -= end - begin;
  }
  void read(int64_t head, float* out) const override {
    SlotPiece pc[3];
    const int np = pieces(0, len_, pc);
    for (int i = 0; i < np; ++i) {
      const Elem* src = data_.data() + (head * capacity_ + pc[i].row) * head_dim_;
      float* dst = out + pc[i].slot * head_dim_;
      const int64_t n = pc[i].n * head_dim_;
      if constexpr (D == DType::F32)
        std::copy_n(src, n, dst);
      else
        ops::to_f32(src, D, dst, n);
    }
  }
  // fp32 rows are attended where they are, piece by piece; fp16/bf16 rows are
  // read back by the cache first (the base class's staged path).
  bool reads_in_place() const override { return D == DType::F32; }
  void key_scores(int64_t head, const float* staged, const float* q, int64_t begin, int64_t end, const float* kcos,
                  const float* ksin, float scale, float* scores) const override {
    if constexpr (D != DType::F32) {
      KVStore::key_scores(head, staged, q, begin, end, kcos, ksin, scale, scores);
    } else {
      const float* base = data_.data() + head * capacity_ * head_dim_;
      SlotPiece pc[3];
      const int np = pieces(begin, end, pc);
      for (int j = 0; j < np; ++j)
        ops::dot_rows(q, base + pc[j].row * head_dim_, pc[j].n, head_dim_, scale, scores + pc[j].slot);
    }
  }
  void value_sum(int64_t head, const float* staged, const float* p, int64_t len, float* out) const override {
    if constexpr (D != DType::F32) {
      KVStore::value_sum(head, staged, p, len, out);
    } else {
      const float* base = data_.data() + head * capacity_ * head_dim_;
      std::fill(out, out + head_dim_, 0.f);
      SlotPiece pc[3];
      const int np = pieces(0, len, pc);
      for (int j = 0; j < np; ++j)
        ops::weighted_sum_rows(p + pc[j].slot, base + pc[j].row * head_dim_, pc[j].n, head_dim_, out);
    }
  }
  // The queries' sums over the longest len: a key past a query's own len has
  // p == 0 there and is skipped, as value_sum skips it, so each sum is value_sum's.
  void value_sum_multi(int64_t head, const float* staged, const float* const* p, const int64_t* len, int m,
                       float* const* out) const override {
    if (m < 1 || m > ops::kMultiQueries) fail("KV store: value_sum_multi over {} queries, expected 1..{}", m, ops::kMultiQueries);
    const int64_t n = *std::max_element(len, len + m);
    for (int j = 0; j < m; ++j) std::fill(out[j], out[j] + head_dim_, 0.f);
    if constexpr (D != DType::F32) {
      ops::weighted_sum_rows_multi(p, m, staged, n, head_dim_, out);
    } else {
      const float* base = data_.data() + head * capacity_ * head_dim_;
      SlotPiece pc[3];
      const int np = pieces(0, n, pc);
      for (int k = 0; k < np; ++k) {
        const float* pk[ops::kMultiQueries];
        for (int j = 0; j < m; ++j) pk[j] = p[j] + pc[k].slot;
        ops::weighted_sum_rows_multi(pk, m, base + pc[k].row * head_dim_, pc[k].n, head_dim_, out);
      }
    }
  }
  // The heads' rows share the slot layout (pieces), so each piece is one
  // interleaved call over the m heads' rows.
  void value_sum_heads(const int64_t* head, const float* const* staged, const float* const* p, int64_t len, int m,
                       float* const* out) const override {
    if (m < 1 || m > ops::kMultiQueries) fail("KV store: value_sum_heads over {} heads, expected 1..{}", m, ops::kMultiQueries);
    for (int j = 0; j < m; ++j) std::fill(out[j], out[j] + head_dim_, 0.f);
    if constexpr (D != DType::F32) {
      ops::weighted_sum_rows_heads(p, staged, m, len, head_dim_, out);
    } else {
      SlotPiece pc[3];
      const int np = pieces(0, len, pc);
      for (int k = 0; k < np; ++k) {
        const float* pk[ops::kMultiQueries];
        const float* vk[ops::kMultiQueries];
        for (int j = 0; j < m; ++j) {
          pk[j] = p[j] + pc[k].slot;
          vk[j] = data_.data() + (head[j] * capacity_ + pc[k].row) * head_dim_;
        }
        ops::weighted_sum_rows_heads(pk, vk, m, pc[k].n, head_dim_, out);
      }
    }
  }
  size_t payload_bytes() const override { return size_t(len_ * n_heads_ * head_dim_) * sizeof(Elem); }
  void clear() override {
    KVStore::clear();
    ring_.clear();
  }

 private:
  // Slots [begin, end) as physically contiguous pieces of rows, in slot order
  // (at most 3: fixed sinks, ring tail, ring head). Returns the count.
  int pieces(int64_t begin, int64_t end, SlotPiece* out) const {
    int k = 0;
    if (begin < sink_cap_ && begin < end) {
      const int64_t e = std::min(end, sink_cap_);
      out[k++] = {begin, begin, e - begin};
      begin = e;
    }
    if (begin < end) {
      const int64_t p0 = ring_.phys(begin - sink_cap_);
      const int64_t first = std::min(end - begin, ring_.cap - p0);
      out[k++] = {begin, sink_cap_ + p0, first};
      if (first < end - begin) out[k++] = {begin + first, sink_cap_, end - begin - first};
    }
    return k;
  }
  static Elem encode(float x) {
    if constexpr (D == DType::F32) return x;
    if constexpr (D == DType::F16) return f32_to_f16(x);
    if constexpr (D == DType::BF16) return f32_to_bf16(x);
  }
  int64_t sink_cap_;
  RowRing ring_;            // the non-sink rows [sink_cap_, capacity)
  uninit_vector<Elem> data_;  // [n_heads, capacity, head_dim]; rows past len_ never read
};

kivi::QuantRange range_of(KVStorage s) {
  return s == KVStorage::Int8   ? kivi::kInt8Range
         : s == KVStorage::Int4 ? kivi::kInt4Range
         : s == KVStorage::Int3 ? kivi::kInt3Range
                                : kivi::kInt2Range;
}

}  // namespace

void KVStore::key_scores(int64_t head, const float* staged, const float* q, int64_t begin, int64_t end,
                         const float* kcos, const float* ksin, float scale, float* scores) const {
  ops::dot_rows(q, staged + begin * head_dim_, end - begin, head_dim_, scale, scores + begin);
}

void KVStore::value_sum(int64_t head, const float* staged, const float* p, int64_t len, float* out) const {
  std::fill(out, out + head_dim_, 0.f);
  ops::weighted_sum_rows(p, staged, len, head_dim_, out);
}

void KVStore::value_sum_multi(int64_t head, const float* staged, const float* const* p, const int64_t* len, int m,
                              float* const* out) const {
  for (int j = 0; j < m; ++j) value_sum(head, staged, p[j], len[j], out[j]);
}

void KVStore::value_sum_heads(const int64_t* head, const float* const* staged, const float* const* p, int64_t len,
                              int m, float* const* out) const {
  for (int j = 0; j < m; ++j) value_sum(head[j], staged[j], p[j], len, out[j]);
}

std::unique_ptr<KVStore> make_value_store(KVStorage s, int64_t n_heads, int64_t capacity, int64_t head_dim,
                                          int64_t sink) {
  switch (s) {
    case KVStorage::F32: return std::make_unique<PlainStore<float, DType::F32>>(n_heads, capacity, head_dim, sink);
    case KVStorage::F16:
      return std::make_unique<PlainStore<uint16_t, DType::F16>>(n_heads, capacity, head_dim, sink);
    case KVStorage::BF16:
      return std::make_unique<PlainStore<uint16_t, DType::BF16>>(n_heads, capacity, head_dim, sink);
    case KVStorage::Int8:
    case KVStorage::Int4:
    case KVStorage::Int3:
    case KVStorage::Int2: return std::make_unique<KiviValueStore>(range_of(s), n_heads, capacity, head_dim);
  }
  fail("KV store: unknown storage");
}

std::unique_ptr<KVStore> make_key_store(KVStorage s, int64_t n_heads, int64_t capacity, int64_t head_dim,
                                        int64_t sink) {
  if (is_quantised(s)) return std::make_unique<KiviKeyStore>(range_of(s), n_heads, capacity, head_dim);
  return make_value_store(s, n_heads, capacity, head_dim, sink);
}

std::unique_ptr<KVStore> make_store(bool key, const CacheSpec& o, int64_t sink, int64_t n_heads, int64_t capacity,
                                    int64_t head_dim) {
  const KVStorage s = key ? o.k_storage() : o.v_storage();
  if (is_quantised(s) && o.kivi_group > 0)
    return std::make_unique<GroupedKiviStore>(
        key && o.k_axis == KeyAxis::Channel ? GroupedKiviStore::Axis::PerChannel : GroupedKiviStore::Axis::PerToken,
        range_of(s), n_heads, capacity,
        head_dim, sink, o.kivi_group, o.kivi_residual,
        o.residual_dtype == KVStorage::F32 ? DType::F32 : o.residual_dtype == KVStorage::BF16 ? DType::BF16 : DType::F16);
  return key ? make_key_store(s, n_heads, capacity, head_dim, sink)
             : make_value_store(s, n_heads, capacity, head_dim, sink);
}

// ---------------- simple KIVI: shared ----------------

KiviCodeStore::KiviCodeStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim,
                             size_t n_params)
    : KVStore(n_heads, capacity, head_dim),
      r_(r),
      row_(kivi::row_bytes(head_dim, r)),
      codes_(size_t(n_heads * capacity) * row_),
      params_(n_params) {}

void KiviCodeStore::evict_codes(int64_t begin, int64_t end) {
  for (int64_t h = 0; h < n_heads_; ++h) {
    uint8_t* base = codes_.data() + size_t(h * capacity_) * row_;
    std::memmove(base + size_t(begin) * row_, base + size_t(end) * row_, size_t(len_ - end) * row_);
  }
}

// ---------------- KIVI keys: per channel ----------------

KiviKeyStore::KiviKeyStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim)
    : KiviCodeStore(r, n_heads, capacity, head_dim, size_t(n_heads * head_dim)) {}

void KiviKeyStore::append(const float* x, int64_t n) {
  const int64_t hd = head_dim_, old = len_, total = len_ + n;
  // The simple scheme: per (head, channel), dequantise what is stored, add the
  // new rows, choose parameters over all of them and re-quantise. A channel
  // whose parameters come out unchanged keeps its codes as they are:
  // re-quantising a dequantised value with the same parameters gives the same
  // code back, so only channels whose range moved are rewritten.
  // Heads are independent; parallel when there is enough work to pay for it.
#pragma omp parallel for schedule(static) if (n_heads_ * total * hd >= (1 << 16))
  for (int64_t h = 0; h < n_heads_; ++h) {
    uint8_t* base = codes_.data() + size_t(h * capacity_) * row_;
    std::vector<uint8_t> umin(static_cast<size_t>(hd), 255), umax(static_cast<size_t>(hd), 0);
    kivi::code_range(base, old, row_, hd, r_, umin.data(), umax.data());
    std::vector<kivi::WideParams> w(static_cast<size_t>(hd));
    for (int64_t c = 0; c < hd; ++c) {
      kivi::AffineParams& p = params_[size_t(h * hd + c)];
      const kivi::WideParams ow = kivi::widen(p);
      float lo = INFINITY, hi = -INFINITY;
      if (old > 0) {
        lo = kivi::dequantise(umin[size_t(c)], ow);
        hi = kivi::dequantise(umax[size_t(c)], ow);
      }
      for (int64_t t = 0; t < n; ++t) {
        const float v = x[(t * n_heads_ + h) * hd + c];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      const kivi::AffineParams np = kivi::choose_params(lo, hi, r_);
      w[size_t(c)] = kivi::widen(np);
      if (old > 0 && (np.scale.bits() != p.scale.bits() || np.zero.bits() != p.zero.bits()))
        for (int64_t t = 0; t < old; ++t) {
          uint8_t* row = base + size_t(t) * row_;
          const float v = kivi::dequantise(kivi::code_at(row, c, r_), ow);
          kivi::set_code(row, c, kivi::quantise(v, w[size_t(c)], r_), r_);
        }
      p = np;
    }
    std::vector<uint8_t> u(static_cast<size_t>(hd));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < hd; ++c) u[size_t(c)] = kivi::quantise(x[(t * n_heads_ + h) * hd + c], w[size_t(c)], r_);
      kivi::pack_row(u.data(), hd, r_, base + size_t(old + t) * row_);
    }
  }
  len_ = total;
}

void KiviKeyStore::evict(int64_t begin, int64_t end) {
  // Codes are sliced; the per-channel parameters still cover every kept row
  // (they were chosen over a superset) and are recomputed at the next append.
  evict_codes(begin, end);
  len_ -= end - begin;
}

void KiviKeyStore::read(int64_t head, float* out) const {
  const int64_t hd = head_dim_;
  float scale[kMaxHeadDim], zero[kMaxHeadDim];
  for (int64_t c = 0; c < hd; ++c) {
    const kivi::WideParams w = kivi::widen(params_[size_t(head * hd + c)]);
    scale[c] = w.scale;
    zero[c] = w.zero;
  }
  const uint8_t* base = codes_.data() + size_t(head * capacity_) * row_;
  for (int64_t t = 0; t < len_; ++t) kivi::dequantise_row(base + size_t(t) * row_, hd, r_, scale, zero, out + t * hd);
}

// One fp16 scale + one fp16 zero per (head, channel), held once anything is stored.
size_t KiviKeyStore::scale_bytes() const {
  return len_ > 0 ? size_t(n_heads_ * head_dim_) * sizeof(kivi::AffineParams) : 0;
}

// ---------------- KIVI values: per token ----------------

KiviValueStore::KiviValueStore(kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim)
    : KiviCodeStore(r, n_heads, capacity, head_dim, size_t(n_heads * capacity)) {}

void KiviValueStore::append(const float* x, int64_t n) {
  const int64_t hd = head_dim_;
  std::vector<uint8_t> u(static_cast<size_t>(hd));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < n_heads_; ++h) {
      const float* src = x + (t * n_heads_ + h) * hd;
      float lo = INFINITY, hi = -INFINITY;
      for (int64_t c = 0; c < hd; ++c) {
        lo = std::min(lo, src[c]);
        hi = std::max(hi, src[c]);
      }
      auto& p = params_[size_t(h * capacity_ + len_ + t)];
      p = kivi::choose_params(lo, hi, r_);
      const kivi::WideParams w = kivi::widen(p);
      for (int64_t c = 0; c < hd; ++c) u[size_t(c)] = kivi::quantise(src[c], w, r_);
      kivi::pack_row(u.data(), hd, r_, codes_.data() + size_t(h * capacity_ + len_ + t) * row_);
    }
  len_ += n;
}

void KiviValueStore::evict(int64_t begin, int64_t end) {
  // Codes and their per-token parameters move together.
  evict_codes(begin, end);
  for (int64_t h = 0; h < n_heads_; ++h) {
    kivi::AffineParams* pb = params_.data() + h * capacity_;
    std::memmove(pb + begin, pb + end, size_t(len_ - end) * sizeof(kivi::AffineParams));
  }
  len_ -= end - begin;
}

void KiviValueStore::read(int64_t head, float* out) const {
  const int64_t hd = head_dim_;
  const uint8_t* base = codes_.data() + size_t(head * capacity_) * row_;
  const kivi::AffineParams* pb = params_.data() + head * capacity_;
  for (int64_t t = 0; t < len_; ++t)
    kivi::dequantise_row(base + size_t(t) * row_, hd, r_, kivi::widen(pb[t]), out + t * hd);
}

size_t KiviValueStore::scale_bytes() const { return size_t(len_ * n_heads_) * sizeof(kivi::AffineParams); }

}  // namespace ptllm
