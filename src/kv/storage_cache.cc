#include "kv/storage_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kv/grouped_store.h"
#include "ops/ops.h"

namespace ptllm {

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

StorageKVCache::StorageKVCache(const KVCacheShape& s, const CacheOptions& o) : KVCache(s), opt_(o) {
  validate(o);
  if (s.capacity < 1) fail("KV cache: capacity {} (expected >= 1)", s.capacity);
  if (s.head_dim % 2 != 0 || s.head_dim > kMaxHeadDim)
    fail("KV cache: head_dim {} (expected even and <= {})", s.head_dim, kMaxHeadDim);
  if (s.n_kv_heads < 1 || s.n_heads % s.n_kv_heads != 0)
    fail("KV cache: {} query heads is not a multiple of {} KV heads", s.n_heads, s.n_kv_heads);
  // Sinks are only full-precision "sinks" in a StreamingLLM cache.
  const int64_t sink = o.streaming() ? o.sink : 0;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    k_.push_back(make_store(true, o, sink, s.n_kv_heads, s.capacity, s.head_dim));
    v_.push_back(make_store(false, o, sink, s.n_kv_heads, s.capacity, s.head_dim));
    kg_.push_back(dynamic_cast<const GroupedKiviStore*>(k_.back().get()));
    vg_.push_back(dynamic_cast<const GroupedKiviStore*>(v_.back().get()));
    pos_.emplace_back();
    pos_.back().reserve(size_t(s.capacity));
  }
  // Quantised keys are stored un-rotated in both RoPE modes: per-channel
  // statistics of pre-RoPE keys are stable, rotated ones mix channel pairs by
  // position. `absolute` then rotates each key at its original position at read time.
  keys_prerope_ = o.rope_mode == RopeMode::Reposition || is_quantised(o.k_storage());
  if (o.rope_mode == RopeMode::Reposition) {
    const int64_t half = s.head_dim / 2;
    cos_.resize(size_t(s.capacity * half));
    sin_.resize(cos_.size());
    for (int64_t t = 0; t < s.capacity; ++t) rope_.cos_sin(double(t), &cos_[size_t(t * half)], &sin_[size_t(t * half)]);
  }
  // Read-back buffers for one layer, sized once so memory stays flat while decoding.
  kbuf_.resize(size_t(s.n_kv_heads * s.capacity * s.head_dim));
  vbuf_.resize(kbuf_.size());
}

void StorageKVCache::append(int64_t layer, const float* k, const float* v, int64_t n) {
  const auto& s = shape_;
  // A layer with its own attention window (Mistral, YOCO self-decoder) never
  // again needs keys that the oldest query of this step cannot see: drop them,
  // so while decoding such a layer holds at most `window` entries. Only a
  // prefix goes, so slots stay contiguous and re-positioned RoPE keeps the true
  // query-key distances.
  const int64_t window = s.window_of(layer);
  if (window > 0 && !bounded()) {
    auto& p = pos_[size_t(layer)];
    int64_t drop = 0;
    while (drop < int64_t(p.size()) && p[size_t(drop)] <= position_ - window) ++drop;
    if (drop > 0) {
      k_[size_t(layer)]->evict(0, drop);
      v_[size_t(layer)]->evict(0, drop);
      p.erase(p.begin(), p.begin() + drop);
    }
  }
  const int64_t len = stored(layer);
  if (len + n > s.capacity) {
    if (!bounded())
      fail("KV cache full: {} stored + {} new > capacity {}", len, n, s.capacity);
    if (n > 1)
      fail("KV cache: {} tokens in one step would overflow the StreamingLLM bound of {} (room() is {})", n,
           s.capacity, room());
    // Exactly the slots that appending first and then dropping [N, len+1-M) would remove.
    const int64_t begin = opt_.sink, end = len + n - opt_.window;
    k_[size_t(layer)]->evict(begin, end);
    v_[size_t(layer)]->evict(begin, end);
    auto& p = pos_[size_t(layer)];
    p.erase(p.begin() + begin, p.begin() + end);
  }
  const int64_t row = s.n_kv_heads * s.head_dim;
  if (!keys_prerope_) {
    // Keys keep the rotation of their original position.
    std::vector<float> rk(k, k + n * row);
    for (int64_t t = 0; t < n; ++t) rope_.apply(rk.data() + t * row, s.n_kv_heads, double(position_ + t));
    k_[size_t(layer)]->append(rk.data(), n);
  } else {
    k_[size_t(layer)]->append(k, n);
  }
  v_[size_t(layer)]->append(v, n);
  for (int64_t t = 0; t < n; ++t) pos_[size_t(layer)].push_back(position_ + t);
}

void StorageKVCache::attend(int64_t layer, const float* q, int64_t n, float* out) {
  const auto& s = shape_;
  const int64_t len = stored(layer), hd = s.head_dim, half = hd / 2, KVH = s.n_kv_heads;
  const int64_t group = s.n_heads / KVH, first = len - n;  // slot of query 0
  if (first < 0) fail("KV cache: attend over {} queries but layer {} holds {} tokens", n, layer, len);
  const bool reposition = opt_.rope_mode == RopeMode::Reposition;
  const KVStore& ks = *k_[size_t(layer)];
  const KVStore& vs = *v_[size_t(layer)];
  const GroupedKiviStore* kg = kg_[size_t(layer)];
  const GroupedKiviStore* vg = vg_[size_t(layer)];
  const int64_t* kp = pos_[size_t(layer)].data();
  const int64_t window = s.window_of(layer);

  // Queries' rotation: their slot (reposition) or absolute position.
  std::vector<float> qcos(static_cast<size_t>(n * half)), qsin(qcos.size());
  for (int64_t i = 0; i < n; ++i) {
    if (reposition) {
      std::copy_n(&cos_[size_t((first + i) * half)], half, &qcos[size_t(i * half)]);
      std::copy_n(&sin_[size_t((first + i) * half)], half, &qsin[size_t(i * half)]);
    } else {
      rope_.cos_sin(double(position_ + i), &qcos[size_t(i * half)], &qsin[size_t(i * half)]);
    }
  }
  // Keys' read-time rotation, [len, half] each: their slot (reposition) or,
  // for pre-RoPE keys in absolute mode, their original position.
  const float* kcos = cos_.data();
  const float* ksin = sin_.data();
  if (!reposition && keys_prerope_) {
    // Every layer of a bounded cache holds the same positions: computed once per step.
    const auto& pv = pos_[size_t(layer)];
    if (abs_pos_ != pv) {
      abs_cos_.resize(size_t(len * half));
      abs_sin_.resize(abs_cos_.size());
      for (int64_t t = 0; t < len; ++t)
        rope_.cos_sin(double(pv[size_t(t)]), &abs_cos_[size_t(t * half)], &abs_sin_[size_t(t * half)]);
      abs_pos_ = pv;
    }
    kcos = abs_cos_.data();
    ksin = abs_sin_.data();
  }

  // Phase 1, parallel over KV heads: heads of non-grouped stores as fp32
  // (dequantised / widened), pre-RoPE keys rotated. Grouped KIVI stores are
  // read by the fused kernels in phase 2 instead (nothing is dequantised).
  std::vector<const float*> K(static_cast<size_t>(KVH)), V(static_cast<size_t>(KVH));
  if (!kg || !vg) {
#pragma omp parallel for schedule(static) if (KVH > 1)
    for (int64_t h = 0; h < KVH; ++h) {
      if (!kg) {
        float* kb = kbuf_.data() + h * s.capacity * hd;
        const float* kd = ks.fp32_rows(h);
        if (keys_prerope_ || !kd) {
          ks.read(h, kb);
          if (keys_prerope_)
            for (int64_t t = 0; t < len; ++t) rope_.apply(kb + t * hd, 1, kcos + t * half, ksin + t * half);
          kd = kb;
        }
        K[size_t(h)] = kd;
      }
      if (!vg) {
        float* vb = vbuf_.data() + h * s.capacity * hd;
        const float* vd = vs.fp32_rows(h);
        if (!vd) {
          vs.read(h, vb);
          vd = vb;
        }
        V[size_t(h)] = vd;
      }
    }
  }

  // Phase 2, parallel over (query, head): softmax attention; scores and the
  // weighted sum come from fp32 rows or straight from grouped codes.
  const int64_t qstride = s.n_heads * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel
  {
    std::vector<float> qr(static_cast<size_t>(hd)), scores(static_cast<size_t>(std::max<int64_t>(len, 1)));
#pragma omp for schedule(static)
    for (int64_t ih = 0; ih < n * s.n_heads; ++ih) {
      const int64_t i = ih / s.n_heads, h = ih % s.n_heads, kvh = h / group;
      float* o = out + i * qstride + h * hd;
      std::copy_n(q + i * qstride + h * hd, hd, qr.data());
      rope_.apply(qr.data(), 1, &qcos[size_t(i * half)], &qsin[size_t(i * half)]);
      // Causal by slot: query i sees slots 0..first+i.
      const int64_t li = first + i + 1, q_pos = kp[first + i];
      if (kg)
        fused_key_scores(*kg, kvh, qr.data(), li, kcos, ksin, scale, scores.data());
      else
        for (int64_t t = 0; t < li; ++t) scores[size_t(t)] = ops::dot_f32(qr.data(), K[size_t(kvh)] + t * hd, hd) * scale;
      bool any = false;
      for (int64_t t = 0; t < li; ++t) {
        const int64_t p = kp[t];
        if (p <= q_pos && (window <= 0 || p > q_pos - window))
          any = true;
        else
          scores[size_t(t)] = -INFINITY;
      }
      if (!any) {
        std::fill(o, o + hd, 0.f);
        continue;
      }
      ops::softmax(scores.data(), li);
      if (vg) {
        fused_value_sum(*vg, kvh, scores.data(), li, o);
      } else {
        std::fill(o, o + hd, 0.f);
        const float* vd = V[size_t(kvh)];
        for (int64_t t = 0; t < li; ++t)
          if (scores[size_t(t)] != 0.f) ops::axpy(scores[size_t(t)], vd + t * hd, o, hd);
      }
    }
  }
}

int64_t StorageKVCache::room() const {
  int64_t used = 0;
  for (auto& k : k_) used = std::max(used, k->size());
  const int64_t free = shape_.capacity - used;
  // A full StreamingLLM cache still takes one token per step (it evicts to make room).
  return bounded() ? std::max<int64_t>(free, 1) : free;
}

size_t StorageKVCache::payload_bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += k_[l]->payload_bytes() + v_[l]->payload_bytes();
  return b;
}

size_t StorageKVCache::scale_bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += k_[l]->scale_bytes() + v_[l]->scale_bytes();
  return b;
}

std::string StorageKVCache::describe() const {
  return fmt::format("{} · {} slots per layer", ptllm::describe(opt_), shape_.capacity);
}

void StorageKVCache::clear() {
  KVCache::clear();
  for (auto& k : k_) k->clear();
  for (auto& v : v_) v->clear();
  for (auto& p : pos_) p.clear();
  abs_pos_.clear();
}

std::vector<float> StorageKVCache::read_keys(int64_t layer, int64_t head) const {
  std::vector<float> out(static_cast<size_t>(stored(layer) * shape_.head_dim));
  k_[size_t(layer)]->read(head, out.data());
  return out;
}

std::vector<float> StorageKVCache::read_values(int64_t layer, int64_t head) const {
  std::vector<float> out(static_cast<size_t>(stored(layer) * shape_.head_dim));
  v_[size_t(layer)]->read(head, out.data());
  return out;
}

}  // namespace ptllm
