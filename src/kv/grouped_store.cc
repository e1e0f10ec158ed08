#include "kv/grouped_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace ptllm {

GroupedKiviStore::GroupedKiviStore(Axis axis, kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim,
                                   int64_t sink, int64_t group, int64_t residual)
    : KVStore(n_heads, capacity, head_dim),
      axis_(axis),
      r_(r),
      sink_cap_(std::min(sink, capacity)),
      group_(group),
      residual_(residual),
      // The residual never holds more than R + G - 1 tokens after an append
      // (R + G triggers a flush), nor more than the whole cache.
      res_cap_(std::min(residual + group, capacity)),
      max_groups_(capacity / std::max<int64_t>(group, 1) + 2),
      row_(kivi::row_bytes(head_dim, r)) {
  if (group < 1 || residual < 0 || residual % group != 0)
    fail("grouped KIVI store: group {} / residual {} (expected group >= 1, residual a multiple of it)", group,
         residual);
  sink_.resize(size_t(n_heads * sink_cap_ * head_dim));
  res_.resize(size_t(n_heads * res_cap_ * head_dim));
  codes_.resize(size_t(n_heads * capacity) * row_);
  params_.resize(axis == Axis::PerChannel ? size_t(n_heads * max_groups_ * head_dim) : size_t(n_heads * capacity));
  group_len_.reserve(size_t(max_groups_));
}

void GroupedKiviStore::append(const float* x, int64_t n) {
  if (len_ + n > capacity_) fail("grouped KIVI store: {} stored + {} new > capacity {}", len_, n, capacity_);
  const int64_t hd = head_dim_;
  for (int64_t t = 0; t < n; ++t) {
    const bool to_sink = n_sink_ < sink_cap_;
    for (int64_t h = 0; h < n_heads_; ++h) {
      const float* src = x + (t * n_heads_ + h) * hd;
      float* dst = to_sink ? sink_.data() + (h * sink_cap_ + n_sink_) * hd : res_.data() + (h * res_cap_ + n_res_) * hd;
      std::copy_n(src, hd, dst);
    }
    if (to_sink) {
      ++n_sink_;
    } else {
      ++n_res_;
      if (n_res_ == residual_ + group_) flush_group();
    }
    ++len_;
  }
}

void GroupedKiviStore::flush_group() {
  const int64_t hd = head_dim_, G = group_;
  const int64_t ng = int64_t(group_len_.size());
  if (axis_ == Axis::PerChannel && ng >= max_groups_) fail("grouped KIVI store: more than {} groups", max_groups_);
  uint8_t u[kMaxHeadDim];
  for (int64_t h = 0; h < n_heads_; ++h) {
    const float* rows = res_.data() + h * res_cap_ * hd;  // oldest G residual rows
    uint8_t* dst = codes_.data() + size_t(h * capacity_ + n_quant_) * row_;
    if (axis_ == Axis::PerChannel) {
      // One (scale, zero) per channel over this group's G tokens, fixed from now on.
      kivi::AffineParams* p = params_.data() + (h * max_groups_ + ng) * hd;
      kivi::WideParams w[kMaxHeadDim];
      for (int64_t c = 0; c < hd; ++c) {
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t t = 0; t < G; ++t) {
          lo = std::min(lo, rows[t * hd + c]);
          hi = std::max(hi, rows[t * hd + c]);
        }
        p[c] = kivi::choose_params(lo, hi, r_);
        w[c] = kivi::widen(p[c]);
      }
      for (int64_t t = 0; t < G; ++t) {
        for (int64_t c = 0; c < hd; ++c) u[c] = kivi::quantise(rows[t * hd + c], w[c], r_);
        kivi::pack_row(u, hd, r_, dst + size_t(t) * row_);
      }
    } else {
      for (int64_t t = 0; t < G; ++t) {
        const float* src = rows + t * hd;
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t c = 0; c < hd; ++c) {
          lo = std::min(lo, src[c]);
          hi = std::max(hi, src[c]);
        }
        kivi::AffineParams& p = params_[size_t(h * capacity_ + n_quant_ + t)];
        p = kivi::choose_params(lo, hi, r_);
        const kivi::WideParams w = kivi::widen(p);
        for (int64_t c = 0; c < hd; ++c) u[c] = kivi::quantise(src[c], w, r_);
        kivi::pack_row(u, hd, r_, dst + size_t(t) * row_);
      }
    }
    // The residual keeps its newest n_res - G rows, moved to its front.
    float* base = res_.data() + h * res_cap_ * hd;
    std::memmove(base, base + G * hd, size_t((n_res_ - G) * hd) * sizeof(float));
  }
  if (axis_ == Axis::PerChannel) group_len_.push_back(G);
  n_quant_ += G;
  n_res_ -= G;
}

void GroupedKiviStore::evict(int64_t begin, int64_t end) {
  if (begin != n_sink_ || end < begin || end > len_)
    fail("grouped KIVI store: evict [{}, {}) must start at the first non-sink slot {} (holds {})", begin, end, n_sink_,
         len_);
  const int64_t hd = head_dim_;
  int64_t k = end - begin;
  // Oldest quantised tokens first: codes (and V's per-token parameters) move
  // down; K groups lose tokens from their front, and go once empty.
  const int64_t kq = std::min(k, n_quant_);
  if (kq > 0) {
    for (int64_t h = 0; h < n_heads_; ++h) {
      uint8_t* base = codes_.data() + size_t(h * capacity_) * row_;
      std::memmove(base, base + size_t(kq) * row_, size_t(n_quant_ - kq) * row_);
      if (axis_ == Axis::PerToken) {
        kivi::AffineParams* pb = params_.data() + h * capacity_;
        std::memmove(pb, pb + kq, size_t(n_quant_ - kq) * sizeof(kivi::AffineParams));
      }
    }
    if (axis_ == Axis::PerChannel) {
      int64_t left = kq, gone = 0;
      while (left > 0) {
        const int64_t take = std::min(left, group_len_[size_t(gone)]);
        group_len_[size_t(gone)] -= take;
        left -= take;
        if (group_len_[size_t(gone)] == 0) ++gone;
      }
      if (gone > 0) {
        const int64_t ng = int64_t(group_len_.size());
        group_len_.erase(group_len_.begin(), group_len_.begin() + gone);
        for (int64_t h = 0; h < n_heads_; ++h) {
          kivi::AffineParams* pb = params_.data() + h * max_groups_ * hd;
          std::memmove(pb, pb + gone * hd, size_t((ng - gone) * hd) * sizeof(kivi::AffineParams));
        }
      }
    }
    n_quant_ -= kq;
    k -= kq;
  }
  // Then (window smaller than the residual) the oldest full-precision rows.
  if (k > 0) {
    for (int64_t h = 0; h < n_heads_; ++h) {
      float* base = res_.data() + h * res_cap_ * hd;
      std::memmove(base, base + k * hd, size_t((n_res_ - k) * hd) * sizeof(float));
    }
    n_res_ -= k;
  }
  len_ -= end - begin;
}

void GroupedKiviStore::read(int64_t head, float* out) const {
  const int64_t hd = head_dim_;
  std::copy_n(sink_rows(head), n_sink_ * hd, out);
  out += n_sink_ * hd;
  const uint8_t* c = codes(head);
  if (axis_ == Axis::PerChannel) {
    int64_t t = 0;
    for (size_t g = 0; g < group_len_.size(); ++g) {
      float scale[kMaxHeadDim], zero[kMaxHeadDim];
      const kivi::AffineParams* p = group_params(head, int64_t(g));
      for (int64_t i = 0; i < hd; ++i) {
        const kivi::WideParams w = kivi::widen(p[i]);
        scale[i] = w.scale;
        zero[i] = w.zero;
      }
      for (int64_t j = 0; j < group_len_[g]; ++j, ++t)
        kivi::dequantise_row(c + size_t(t) * row_, hd, r_, scale, zero, out + t * hd);
    }
  } else {
    for (int64_t t = 0; t < n_quant_; ++t)
      kivi::dequantise_row(c + size_t(t) * row_, hd, r_, kivi::widen(token_params(head, t)), out + t * hd);
  }
  out += n_quant_ * hd;
  std::copy_n(resid_rows(head), n_res_ * hd, out);
}

size_t GroupedKiviStore::payload_bytes() const {
  return size_t((n_sink_ + n_res_) * n_heads_ * head_dim_) * sizeof(float) + size_t(n_quant_ * n_heads_) * row_;
}

size_t GroupedKiviStore::scale_bytes() const {
  const int64_t n = axis_ == Axis::PerChannel ? int64_t(group_len_.size()) * head_dim_ : n_quant_;
  return size_t(n * n_heads_) * sizeof(kivi::AffineParams);
}

void GroupedKiviStore::clear() {
  KVStore::clear();
  n_sink_ = n_quant_ = n_res_ = 0;
  group_len_.clear();
}

// ---------------- fused attention ----------------

namespace {

// Codes of one row as floats (int4/int2 unpacked first).
inline void codes_to_float(const uint8_t* row, int64_t hd, kivi::QuantRange r, float* __restrict out) {
  uint8_t tmp[kMaxHeadDim];
  const uint8_t* __restrict u = kivi::unpack_row(row, hd, r, tmp);
  for (int64_t i = 0; i < hd; ++i) out[i] = float(u[i]);
}

// q . R(t) k for one fp32 (pre-RoPE) key row.
inline float rotated_dot(const float* q, const float* k, const float* c, const float* s, int64_t half) {
  float a[kMaxHeadDim / 2], b[kMaxHeadDim / 2];
  for (int64_t i = 0; i < half; ++i) {
    a[i] = q[i] * k[i] + q[i + half] * k[i + half];
    b[i] = q[i + half] * k[i] - q[i] * k[i + half];
  }
  return ops::dot_f32(c, a, half) + ops::dot_f32(s, b, half);
}

}  // namespace

void fused_key_scores(const GroupedKiviStore& K, int64_t head, const float* q, int64_t len, const float* kcos,
                      const float* ksin, float scale, float* scores) {
  const int64_t hd = K.head_dim(), half = hd / 2;
  const int64_t ns = K.n_sink(), nq = K.n_quant();
  // Sinks: fp32.
  const float* sk = K.sink_rows(head);
  for (int64_t t = 0; t < std::min(len, ns); ++t)
    scores[t] = scale * rotated_dot(q, sk + t * hd, kcos + t * half, ksin + t * half, half);
  // Quantised groups: scales and zeros folded into the query once per group.
  const uint8_t* codes = K.codes(head);
  const size_t row = K.row_bytes();
  const kivi::QuantRange r = K.range();
  float P[kMaxHeadDim / 2], Q[kMaxHeadDim / 2], X[kMaxHeadDim / 2], Y[kMaxHeadDim / 2], C1[kMaxHeadDim / 2],
      C2[kMaxHeadDim / 2], u[kMaxHeadDim], a[kMaxHeadDim / 2], b[kMaxHeadDim / 2];
  int64_t t = 0;  // quantised token index
  const auto& sizes = K.group_sizes();
  for (size_t g = 0; g < sizes.size() && ns + t < len; ++g) {
    const kivi::AffineParams* p = K.group_params(head, int64_t(g));
    for (int64_t i = 0; i < half; ++i) {
      const kivi::WideParams lo = kivi::widen(p[i]), hi = kivi::widen(p[i + half]);
      P[i] = q[i] * lo.scale;
      Q[i] = q[i + half] * hi.scale;
      X[i] = q[i + half] * lo.scale;
      Y[i] = q[i] * hi.scale;
      C1[i] = q[i] * lo.zero + q[i + half] * hi.zero;
      C2[i] = q[i + half] * lo.zero - q[i] * hi.zero;
    }
    const int64_t end = std::min(t + sizes[g], len - ns);
    for (; t < end; ++t) {
      codes_to_float(codes + size_t(t) * row, hd, r, u);
      for (int64_t i = 0; i < half; ++i) {
        a[i] = P[i] * u[i] + Q[i] * u[i + half] + C1[i];
        b[i] = X[i] * u[i] - Y[i] * u[i + half] + C2[i];
      }
      const int64_t slot = ns + t;
      scores[slot] = scale * (ops::dot_f32(kcos + slot * half, a, half) + ops::dot_f32(ksin + slot * half, b, half));
    }
  }
  (void)nq;
  // Residual: fp32.
  const float* rk = K.resid_rows(head);
  for (int64_t slot = ns + nq; slot < len; ++slot)
    scores[slot] = scale * rotated_dot(q, rk + (slot - ns - nq) * hd, kcos + slot * half, ksin + slot * half, half);
}

void fused_value_sum(const GroupedKiviStore& V, int64_t head, const float* p, int64_t len, float* out) {
  const int64_t hd = V.head_dim(), ns = V.n_sink(), nq = V.n_quant();
  std::fill(out, out + hd, 0.f);
  const float* sv = V.sink_rows(head);
  for (int64_t t = 0; t < std::min(len, ns); ++t)
    if (p[t] != 0.f) ops::axpy(p[t], sv + t * hd, out, hd);
  const uint8_t* codes = V.codes(head);
  const size_t row = V.row_bytes();
  const kivi::QuantRange r = V.range();
  float acc[kMaxHeadDim] = {}, u[kMaxHeadDim];
  float bias = 0.f;
  const int64_t qend = std::min(nq, len - ns);
  for (int64_t t = 0; t < qend; ++t) {
    const float pt = p[ns + t];
    if (pt == 0.f) continue;
    const kivi::WideParams w = kivi::widen(V.token_params(head, t));
    codes_to_float(codes + size_t(t) * row, hd, r, u);
    const float ps = pt * w.scale;
    for (int64_t i = 0; i < hd; ++i) acc[i] += ps * u[i];
    bias += pt * w.zero;
  }
  for (int64_t i = 0; i < hd; ++i) out[i] += acc[i] + bias;
  const float* rv = V.resid_rows(head);
  for (int64_t slot = ns + nq; slot < len; ++slot)
    if (p[slot] != 0.f) ops::axpy(p[slot], rv + (slot - ns - nq) * hd, out, hd);
}

}  // namespace ptllm
