#include "kv/reference_cache.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace ptllm {

void attend_fp32(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, const float* k,
                 const float* v, int64_t stride, const int64_t* key_pos, int64_t len, int64_t q_pos,
                 int64_t sliding_window, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  std::vector<float> scores(size_t(std::max<int64_t>(len, 1)));
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t kvh = h / group;
    const float* qh = q + h * head_dim;
    const float* kh = k + kvh * stride * head_dim;
    const float* vh = v + kvh * stride * head_dim;
    float* oh = out + h * head_dim;
    std::fill(oh, oh + head_dim, 0.f);
    bool any = false;
    for (int64_t t = 0; t < len; ++t) {
      const int64_t p = key_pos ? key_pos[t] : t;
      const bool visible = p <= q_pos && (sliding_window <= 0 || p > q_pos - sliding_window);
      if (visible) {
        scores[size_t(t)] = ops::dot_f32(qh, kh + t * head_dim, head_dim) * scale;
        any = true;
      } else {
        scores[size_t(t)] = -INFINITY;
      }
    }
    if (!any) continue;
    ops::softmax(scores.data(), len);
    for (int64_t t = 0; t < len; ++t)
      if (scores[size_t(t)] != 0.f) ops::axpy(scores[size_t(t)], vh + t * head_dim, oh, head_dim);
  }
}

Fp32KVCache::Fp32KVCache(const KVCacheShape& s) : KVCache(s) {
  const size_t per_layer = size_t(s.n_kv_heads * s.capacity * s.head_dim);
  k_.assign(size_t(s.n_layers), std::vector<float>(per_layer));
  v_.assign(size_t(s.n_layers), std::vector<float>(per_layer));
  len_.assign(size_t(s.n_layers), 0);
}

void Fp32KVCache::append(int64_t layer, const float* k, const float* v, int64_t n) {
  const auto& s = shape_;
  int64_t& len = len_[size_t(layer)];
  if (len + n > s.capacity) fail("KV cache full: {} stored + {} new > capacity {}", len, n, s.capacity);
  std::vector<float> rk(size_t(s.n_kv_heads * s.head_dim));
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(k + t * s.n_kv_heads * s.head_dim, rk.size(), rk.data());
    rope_.apply(rk.data(), s.n_kv_heads, double(position_ + t));
    for (int64_t h = 0; h < s.n_kv_heads; ++h) {
      const size_t dst = size_t((h * s.capacity + len + t) * s.head_dim);
      std::copy_n(rk.data() + h * s.head_dim, s.head_dim, k_[size_t(layer)].data() + dst);
      std::copy_n(v + (t * s.n_kv_heads + h) * s.head_dim, s.head_dim, v_[size_t(layer)].data() + dst);
    }
  }
  len += n;
}

void Fp32KVCache::attend(int64_t layer, const float* q, int64_t n, float* out) {
  const auto& s = shape_;
  const int64_t len = len_[size_t(layer)];
  // Slot t holds absolute position t (nothing is ever evicted here).
  std::vector<int64_t> pos(static_cast<size_t>(len));
  for (int64_t t = 0; t < len; ++t) pos[size_t(t)] = t;
  const int64_t qstride = s.n_heads * s.head_dim;
#pragma omp parallel for schedule(dynamic) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> rq(q + i * qstride, q + (i + 1) * qstride);
    const int64_t qp = position_ + i;
    rope_.apply(rq.data(), s.n_heads, double(qp));
    attend_fp32(rq.data(), s.n_heads, s.n_kv_heads, s.head_dim, k_[size_t(layer)].data(), v_[size_t(layer)].data(),
                s.capacity, pos.data(), std::min(len, qp + 1), qp, s.window_of(layer), out + i * qstride);
  }
}

int64_t Fp32KVCache::room() const {
  int64_t used = 0;
  for (auto l : len_) used = std::max(used, l);
  return shape_.capacity - used;
}

size_t Fp32KVCache::payload_bytes() const {
  size_t n = 0;
  for (auto l : len_) n += size_t(l) * size_t(shape_.n_kv_heads * shape_.head_dim) * 2 * sizeof(float);
  return n;
}

void Fp32KVCache::clear() {
  KVCache::clear();
  std::fill(len_.begin(), len_.end(), 0);
}

void attend_head(const float* q, const float* k, const float* v, int64_t len, int64_t hd, const int64_t* key_pos,
                 int64_t q_pos, int64_t window, float* scores, float* out) {
  const float scale = 1.0f / std::sqrt(float(hd));
  std::fill(out, out + hd, 0.f);
  bool any = false;
  for (int64_t t = 0; t < len; ++t) {
    const int64_t p = key_pos[t];
    if (p <= q_pos && (window <= 0 || p > q_pos - window)) {
      scores[t] = ops::dot_f32(q, k + t * hd, hd) * scale;
      any = true;
    } else {
      scores[t] = -INFINITY;
    }
  }
  if (!any) return;
  ops::softmax(scores, len);
  for (int64_t t = 0; t < len; ++t)
    if (scores[t] != 0.f) ops::axpy(scores[t], v + t * hd, out, hd);
}

}  // namespace ptllm
