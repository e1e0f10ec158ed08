#include "kv/grouped_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/kivi_kernels.h"
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
  qring_.cap = capacity;
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
  // Physical rows of the G new quantised tokens (the ring may wrap inside a group).
  std::vector<int64_t> prow(static_cast<size_t>(G));
  for (int64_t t = 0; t < G; ++t) prow[size_t(t)] = qring_.phys(n_quant_ + t);
  for (int64_t h = 0; h < n_heads_; ++h) {
    const float* rows = res_.data() + h * res_cap_ * hd;  // oldest G residual rows
    uint8_t* dst = codes_.data() + size_t(h * capacity_) * row_;
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
        kivi::pack_row(u, hd, r_, dst + size_t(prow[size_t(t)]) * row_);
      }
    } else {
      for (int64_t t = 0; t < G; ++t) {
        const float* src = rows + t * hd;
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t c = 0; c < hd; ++c) {
          lo = std::min(lo, src[c]);
          hi = std::max(hi, src[c]);
        }
        kivi::AffineParams& p = params_[size_t(h * capacity_ + prow[size_t(t)])];
        p = kivi::choose_params(lo, hi, r_);
        const kivi::WideParams w = kivi::widen(p);
        for (int64_t c = 0; c < hd; ++c) u[c] = kivi::quantise(src[c], w, r_);
        kivi::pack_row(u, hd, r_, dst + size_t(prow[size_t(t)]) * row_);
      }
    }
    // The residual keeps its newest n_res - G rows, moved to its front.
    float* base = res_.data() + h * res_cap_ * hd;
    std::memmove(base, base + G * hd, size_t((n_res_ - G) * hd) * sizeof(float));
  }
  if (axis_ == Axis::PerChannel) group_len_.push_back(G);
  qring_.count += G;
  n_quant_ += G;
  n_res_ -= G;
}

void GroupedKiviStore::evict(int64_t begin, int64_t end) {
  if (begin != n_sink_ || end < begin || end > len_)
    fail("grouped KIVI store: evict [{}, {}) must start at the first non-sink slot {} (holds {})", begin, end, n_sink_,
         len_);
  const int64_t hd = head_dim_;
  int64_t k = end - begin;
  // Oldest quantised tokens first: the ring of codes (and V's per-token
  // parameters) drops them without copying; K groups lose tokens from their
  // front, and their parameters go (a small copy, once per G tokens) when empty.
  const int64_t kq = std::min(k, n_quant_);
  if (kq > 0) {
    qring_.pop_front(kq);
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
        kivi::dequantise_row(code_row(head, t), hd, r_, scale, zero, out + t * hd);
    }
  } else {
    for (int64_t t = 0; t < n_quant_; ++t)
      kivi::dequantise_row(code_row(head, t), hd, r_, kivi::widen(token_params(head, t)), out + t * hd);
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

ops::KiviCodes GroupedKiviStore::codes(int64_t head) const {
  ops::KiviCodes c;
  c.base = codes_.data() + size_t(head * capacity_) * row_;
  c.row_bytes = row_;
  c.cap = qring_.cap;
  c.start = qring_.start;
  c.head_dim = head_dim_;
  c.range = r_;
  return c;
}

// Slots in order: [sinks fp32][quantised groups][residual fp32]; only the
// quantised middle goes through the code kernels.
void GroupedKiviStore::key_scores(int64_t head, const float* staged, const float* q, int64_t begin, int64_t end,
                                  const float* kcos, const float* ksin, float scale, float* scores) const {
  const int64_t hd = head_dim_, half = hd / 2;
  const int64_t ns = n_sink_, nq = n_quant_;
  // Sinks: fp32.
  const float* sk = sink_rows(head);
  const int64_t se = std::min(end, ns);
  if (begin < se)
    ops::dot_rows_rotated(q, sk + begin * hd, se - begin, hd, kcos + begin * half, ksin + begin * half, scale,
                          scores + begin);
  // Quantised groups: scales and zeros folded into the query once per group.
  const int64_t qb = std::max<int64_t>(begin - ns, 0), qe = std::min(end - ns, nq);  // quantised indices
  if (qb < qe) {
    const ops::KiviCodes kc = codes(head);
    int64_t g0 = 0;  // first token of group g
    for (size_t g = 0; g < group_len_.size() && g0 < qe; g0 += group_len_[g], ++g) {
      const int64_t a = std::max(g0, qb), b = std::min(g0 + group_len_[g], qe);
      if (a >= b) continue;
      const int64_t slot = ns + a;
      ops::kivi_key_scores(kc, a, b - a, group_params(head, int64_t(g)), q, scale, kcos + slot * half,
                           ksin + slot * half, scores + slot);
    }
  }
  // Residual: fp32.
  const float* rk = resid_rows(head);
  const int64_t rb = std::max(begin, ns + nq);
  if (rb < end)
    ops::dot_rows_rotated(q, rk + (rb - ns - nq) * hd, end - rb, hd, kcos + rb * half, ksin + rb * half, scale,
                          scores + rb);
}

void GroupedKiviStore::value_sum(int64_t head, const float* staged, const float* p, int64_t len, float* out) const {
  const int64_t hd = head_dim_, ns = n_sink_, nq = n_quant_;
  std::fill(out, out + hd, 0.f);
  ops::weighted_sum_rows(p, sink_rows(head), std::min(len, ns), hd, out);
  // sum_t p_t (s_t u_t + z_t) = sum_t (p_t s_t) u_t + sum_t p_t z_t; V's
  // per-token parameters are indexed by physical row like the codes.
  const int64_t qend = std::min(nq, len - ns);
  if (qend > 0) ops::kivi_value_sum(codes(head), 0, qend, params_.data() + head * capacity_, p + ns, out);
  if (len > ns + nq) ops::weighted_sum_rows(p + ns + nq, resid_rows(head), len - ns - nq, hd, out);
}

void GroupedKiviStore::clear() {
  KVStore::clear();
  n_sink_ = n_quant_ = n_res_ = 0;
  qring_.clear();
  group_len_.clear();
}

}  // namespace ptllm
