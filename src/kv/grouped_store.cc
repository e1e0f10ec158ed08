#include "kv/grouped_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/memory.h"
#include "ops/kivi_kernels.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace ptllm {

GroupedKiviStore::GroupedKiviStore(Axis axis, kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim,
                                   int64_t sink, int64_t group, int64_t residual, DType resid)
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
      row_(kivi::row_bytes(head_dim, r)),
      rdt_(resid),
      esz_(resid == DType::F32 ? 4 : 2) {
  if (resid != DType::F32 && resid != DType::F16 && resid != DType::BF16)
    fail("grouped KIVI store: residual dtype must be fp32, fp16 or bf16");
  if (group < 1 || residual < 0 || residual % group != 0)
    fail("grouped KIVI store: group {} / residual {} (expected group >= 1, residual a multiple of it)", group,
         residual);
  // Zero-filled, so every page is written now: populate first, which costs a
  // fraction of one fault per page (core/memory.h).
  const auto zeroed = [](auto& v, size_t n) {
    v.reserve(n);
    populate_pages(v.data(), n * sizeof(v[0]));
    v.resize(n);
  };
  zeroed(sink_, size_t(n_heads * sink_cap_ * head_dim) * esz_);
  zeroed(res_, size_t(n_heads * res_cap_ * head_dim) * esz_);
  zeroed(codes_, size_t(n_heads * capacity) * row_);
  zeroed(params_, axis == Axis::PerChannel ? size_t(n_heads * max_groups_ * head_dim) : size_t(n_heads * capacity));
  group_len_.reserve(size_t(max_groups_));
  qring_.cap = capacity;
}

namespace {
constexpr float kF16Max = 65504.f;
}  // namespace

// Row `row` (counted over [n_heads * cap] rows) of a sink/residual buffer.
void GroupedKiviStore::put_row(std::vector<uint8_t>& buf, int64_t row, const float* x) {
  const int64_t hd = head_dim_;
  uint8_t* dst = buf.data() + size_t(row * hd) * esz_;
  if (rdt_ == DType::F32) {
    std::memcpy(dst, x, size_t(hd) * sizeof(float));
    return;
  }
  uint16_t h[kMaxHeadDim];
  for (int64_t c = 0; c < hd; ++c) {
    if (rdt_ == DType::BF16) {
      h[c] = f32_to_bf16(x[c]);
    } else {
      // Saturate: an fp16 inf would turn the next q.k or p.v into inf/NaN.
      const float v = std::isnan(x[c]) ? 0.f : std::clamp(x[c], -kF16Max, kF16Max);
      h[c] = f32_to_f16(v);
    }
  }
  std::memcpy(dst, h, size_t(hd) * 2);
}

const float* GroupedKiviStore::full_rows(const std::vector<uint8_t>& buf, int64_t row, int64_t n, float* tmp) const {
  const uint8_t* src = buf.data() + size_t(row * head_dim_) * esz_;
  if (rdt_ == DType::F32) return reinterpret_cast<const float*>(src);
  if (n > 0) ops::to_f32(src, rdt_, tmp, n * head_dim_);
  return tmp;
}

void GroupedKiviStore::append(const float* x, int64_t n) {
  if (len_ + n > capacity_) fail("grouped KIVI store: {} stored + {} new > capacity {}", len_, n, capacity_);
  const int64_t hd = head_dim_;
  for (int64_t t = 0; t < n; ++t) {
    const bool to_sink = n_sink_ < sink_cap_;
    for (int64_t h = 0; h < n_heads_; ++h) {
      const float* src = x + (t * n_heads_ + h) * hd;
      if (to_sink)
        put_row(sink_, h * sink_cap_ + n_sink_, src);
      else
        put_row(res_, h * res_cap_ + n_res_, src);
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
  std::vector<float> wide(rdt_ == DType::F32 ? 0 : size_t(G * hd));
  for (int64_t h = 0; h < n_heads_; ++h) {
    const float* rows = resid_rows(h, 0, G, wide.data());  // oldest G residual rows, fp32
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
    uint8_t* base = res_.data() + size_t(h * res_cap_ * hd) * esz_;
    std::memmove(base, base + size_t(G * hd) * esz_, size_t((n_res_ - G) * hd) * esz_);
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
      uint8_t* base = res_.data() + size_t(h * res_cap_ * hd) * esz_;
      std::memmove(base, base + size_t(k * hd) * esz_, size_t((n_res_ - k) * hd) * esz_);
    }
    n_res_ -= k;
  }
  len_ -= end - begin;
}

void GroupedKiviStore::read(int64_t head, float* out) const {
  const int64_t hd = head_dim_;
  if (n_sink_ > 0) {
    const float* r = sink_rows(head, 0, n_sink_, out);  // widened in place, or fp32 rows to copy
    if (r != out) std::copy_n(r, n_sink_ * hd, out);
  }
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
  if (n_res_ > 0) {
    const float* r = resid_rows(head, 0, n_res_, out);
    if (r != out) std::copy_n(r, n_res_ * hd, out);
  }
}

size_t GroupedKiviStore::payload_bytes() const {
  return size_t((n_sink_ + n_res_) * n_heads_ * head_dim_) * esz_ + size_t(n_quant_ * n_heads_) * row_;
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
  // fp16/bf16 sink and residual rows are widened here, a few rows at a time
  // (at most R + G - 1 + sink), never the quantised groups.
  thread_local std::vector<float> wide;
  if (rdt_ != DType::F32) wide.resize(size_t(std::max(sink_cap_, res_cap_) * hd));
  // Keys stored after RoPE (kcos == nullptr: rotate hadamard or k_axis token)
  // are not turned: plain dots for the full-precision rows.
  const auto full_dots = [&](const float* rows, int64_t b, int64_t n) {
    if (kcos)
      ops::dot_rows_rotated(q, rows, n, hd, kcos + b * half, ksin + b * half, scale, scores + b);
    else
      ops::dot_rows(q, rows, n, hd, scale, scores + b);
  };
  // Sinks.
  const int64_t se = std::min(end, ns);
  if (begin < se) full_dots(sink_rows(head, begin, se - begin, wide.data()), begin, se - begin);
  // Quantised groups: scales and zeros folded into the query once per group.
  const int64_t qb = std::max<int64_t>(begin - ns, 0), qe = std::min(end - ns, nq);  // quantised indices
  if (qb < qe && axis_ == Axis::PerToken) {
    // Per-token keys (after RoPE): one (scale, zero) per token, like V.
    ops::kivi_key_scores_tokens(codes(head), qb, qe - qb, params_.data() + head * capacity_, q, scale,
                                scores + ns + qb);
  } else if (qb < qe) {
    const ops::KiviCodes kc = codes(head);
    // Keys after RoPE in per-channel groups: the RoPE kernel with cos 1, sin 0
    // (an identity table of kChunk rows, reused chunk by chunk).
    constexpr int64_t kChunk = 64;
    thread_local std::vector<float> one, zero;
    if (!kcos && one.empty()) {
      one.assign(size_t(kChunk * (kMaxHeadDim / 2)), 1.f);
      zero.assign(one.size(), 0.f);
    }
    int64_t g0 = 0;  // first token of group g
    for (size_t g = 0; g < group_len_.size() && g0 < qe; g0 += group_len_[g], ++g) {
      const int64_t a = std::max(g0, qb), b = std::min(g0 + group_len_[g], qe);
      if (a >= b) continue;
      const int64_t slot = ns + a;
      if (kcos) {
        ops::kivi_key_scores(kc, a, b - a, group_params(head, int64_t(g)), q, scale, kcos + slot * half,
                             ksin + slot * half, scores + slot);
      } else {
        for (int64_t c = a; c < b; c += kChunk)
          ops::kivi_key_scores(kc, c, std::min(kChunk, b - c), group_params(head, int64_t(g)), q, scale, one.data(),
                               zero.data(), scores + ns + c);
      }
    }
  }
  // Residual.
  const int64_t rb = std::max(begin, ns + nq);
  if (rb < end) full_dots(resid_rows(head, rb - ns - nq, end - rb, wide.data()), rb, end - rb);
}

void GroupedKiviStore::value_sum(int64_t head, const float* staged, const float* p, int64_t len, float* out) const {
  const int64_t hd = head_dim_, ns = n_sink_, nq = n_quant_;
  std::fill(out, out + hd, 0.f);
  thread_local std::vector<float> wide;
  if (rdt_ != DType::F32) wide.resize(size_t(std::max(sink_cap_, res_cap_) * hd));
  const int64_t sn = std::min(len, ns);
  if (sn > 0) ops::weighted_sum_rows(p, sink_rows(head, 0, sn, wide.data()), sn, hd, out);
  // sum_t p_t (s_t u_t + z_t) = sum_t (p_t s_t) u_t + sum_t p_t z_t; V's
  // per-token parameters are indexed by physical row like the codes.
  const int64_t qend = std::min(nq, len - ns);
  if (qend > 0) ops::kivi_value_sum(codes(head), 0, qend, params_.data() + head * capacity_, p + ns, out);
  if (len > ns + nq)
    ops::weighted_sum_rows(p + ns + nq, resid_rows(head, 0, len - ns - nq, wide.data()), len - ns - nq, hd, out);
}

void GroupedKiviStore::clear() {
  KVStore::clear();
  n_sink_ = n_quant_ = n_res_ = 0;
  qring_.clear();
  group_len_.clear();
}

}  // namespace ptllm
