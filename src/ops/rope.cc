#include "ops/rope.h"

#include <cmath>
#include <numbers>

namespace ptllm {

Rope::Rope(const RopeConfig& cfg, int64_t head_dim) : head_dim_(head_dim) {
  const int64_t half = head_dim / 2;
  inv_freq_.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i) {
    // Same expression as transformers (computed in float32 there): theta^(-2i/d).
    const float f = float(1.0 / std::pow(cfg.theta, double(2 * i) / double(head_dim)));
    inv_freq_[size_t(i)] = f;
  }
  if (cfg.type == RopeConfig::Type::Linear) {
    for (auto& f : inv_freq_) f /= cfg.factor;
  } else if (cfg.type == RopeConfig::Type::Llama3) {
    // Llama 3.1 frequency-dependent scaling: long wavelengths are divided by
    // `factor`, short ones kept, the band between interpolated smoothly.
    const double old_ctx = double(cfg.original_max_position);
    const double low_wavelen = old_ctx / cfg.low_freq_factor;
    const double high_wavelen = old_ctx / cfg.high_freq_factor;
    for (auto& f : inv_freq_) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = f / cfg.factor;
      } else {
        const double smooth = (old_ctx / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor);
        f = (1 - smooth) * f / cfg.factor + smooth * f;
      }
    }
  }
  if (cfg.freq_factors.size() == size_t(half))
    for (int64_t i = 0; i < half; ++i) inv_freq_[size_t(i)] /= cfg.freq_factors[size_t(i)];
}

void Rope::cos_sin(double pos, float* cos, float* sin) const {
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    // transformers multiplies in fp32: keep that rounding of the angle.
    const float angle = float(pos) * float(inv_freq_[i]);
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
}

void Rope::apply(float* x, int64_t n_heads, const float* cos, const float* sin) const {
  const int64_t half = head_dim_ / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim_;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

void Rope::apply(float* x, int64_t n_heads, double pos) const {
  float c[kMaxHeadDim / 2], s[kMaxHeadDim / 2];
  cos_sin(pos, c, s);
  apply(x, n_heads, c, s);
}

}  // namespace ptllm
