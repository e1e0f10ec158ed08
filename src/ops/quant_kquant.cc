// Quantisers for the K types (Q4_K, Q5_K, Q6_K). Not ggml's algorithm: a
// per-sub-block least-squares search of (scale, min) from several starting
// ranges, then the sub-block scales quantised to 6 (Q4_K/Q5_K) or 8 (Q6_K)
// bits against an f16 super-block scale, and every element re-rounded with
// the scales as they will be read back. The bytes follow ggml's layouts, so
// llama.cpp reads them the same way (quant_test states the error reached).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/quant_impl.h"

namespace ptllm::ops::q {
namespace {

int nearest(float v) { return round_nearest(v); }

// The affine search: kTrialsLo x kTrialsHi starting ranges, each refit kRefits times.
constexpr int kTrialsLo = 3, kTrialsHi = 3, kRefits = 2;
constexpr float kShrinkStep = 0.05f;

// Affine fit of n values to x ~= scale * L - mn_neg, L in [0, nmax], with the
// offset restricted to <= 0 as the K types store it (x = d*sc*q - dmin*m,
// m >= 0). Returns the scale; *mn_neg receives the (non-negative) -offset.
float fit_affine(const float* x, int n, int nmax, float* mn_neg) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.f);
  if (hi <= lo) {
    *mn_neg = -lo;
    return 0.f;
  }
  float best_err = INFINITY, best_scale = 0.f, best_min = lo;
  int L[32];
  // Starting ranges: the full [lo, hi] and ones trimmed at either end; each is
  // refined by alternating rounding and a least-squares refit (twice).
  for (int trial = 0; trial < kTrialsLo * kTrialsHi; ++trial) {
    const float shrink_lo = kShrinkStep * float(trial % kTrialsLo), shrink_hi = kShrinkStep * float(trial / kTrialsLo);
    float mn = lo * (1.f - shrink_lo);
    float scale = (hi - (hi - lo) * shrink_hi - mn) / float(nmax);
    if (scale <= 0.f) continue;
    for (int it = 0; it < kRefits; ++it) {
      const float inv = 1.f / scale;
      for (int i = 0; i < n; ++i) L[i] = std::clamp(nearest((x[i] - mn) * inv), 0, nmax);
      // min over (s, m) of sum (s*L + m - x)^2, m <= 0.
      double sl = 0, sll = 0, sx = 0, slx = 0;
      for (int i = 0; i < n; ++i) {
        sl += L[i];
        sll += double(L[i]) * L[i];
        sx += x[i];
        slx += double(L[i]) * x[i];
      }
      const double det = n * sll - sl * sl;
      if (det <= 0) break;
      double s = (n * slx - sl * sx) / det, m = (sx - s * sl) / n;
      if (m > 0) {
        m = 0;
        s = sll > 0 ? slx / sll : 0;
      }
      if (s <= 0) break;
      scale = float(s);
      mn = float(m);
    }
    float err = 0.f;
    const float inv = 1.f / scale;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest((x[i] - mn) * inv), 0, nmax);
      const float e = scale * float(l) + mn - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_min = mn;
    }
  }
  *mn_neg = -best_min;
  return best_scale;
}

// Symmetric fit x ~= scale * l, l in [-32, 31] (Q6_K). The element of largest
// magnitude is tried at -32 and at nearby levels; each candidate's scale is
// refit by least squares for its rounding.
float fit_symmetric(const float* x, int n) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax == 0.f) return 0.f;
  float best_err = INFINITY, best = max / -32.f;
  for (int k = -6; k <= 6; ++k) {
    const float iscale = -(32.f + 0.25f * float(k)) / max;
    double slx = 0, sll = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest(iscale * x[i]), -32, 31);
      slx += double(l) * x[i];
      sll += double(l) * l;
    }
    if (sll <= 0) continue;
    const float s = float(slx / sll);
    float err = 0.f;
    for (int i = 0; i < n; ++i) {
      const float e = s * float(std::clamp(nearest(x[i] / s), -32, 31)) - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best = s;
    }
  }
  return best;
}

// Packs 8 six-bit scales and mins into ggml's 12 bytes (inverse of k4_scales).
void pack_k4_scales(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = uint8_t(sc[j] | (sc[j + 4] >> 4) << 6);
    s[j + 4] = uint8_t(m[j] | (m[j + 4] >> 4) << 6);
    s[j + 8] = uint8_t((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
}

// Shared by Q4_K and Q5_K: fills d, dmin, scales and the levels L[256].
template <typename B>
void quantize_k_levels(const float* x, int nmax, B* y, uint8_t* L) {
  float scale[8], mn[8], max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    scale[j] = fit_affine(x + 32 * j, 32, nmax, &mn[j]);
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, mn[j]);
  }
  // Super-block scales are f16: round them first and quantise the sub-block
  // scales against the rounded values, which is what a reader multiplies by.
  y->d = f32_to_f16(max_scale / 63.f);
  y->dmin = f32_to_f16(max_min / 63.f);
  const float d = f16_to_f32(y->d), dmin = f16_to_f32(y->dmin);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = uint8_t(d > 0.f ? std::clamp(nearest(scale[j] / d), 0, 63) : 0);
    m[j] = uint8_t(dmin > 0.f ? std::clamp(nearest(mn[j] / dmin), 0, 63) : 0);
  }
  pack_k4_scales(sc, m, y->scales);
  for (int j = 0; j < 8; ++j) {
    const float ds = d * float(sc[j]), ms = dmin * float(m[j]);
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = uint8_t(ds > 0.f ? std::clamp(nearest((x[32 * j + i] + ms) / ds), 0, nmax) : 0);
  }
}

}  // namespace

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    uint8_t L[256];
    quantize_k_levels(x, 15, &y[i], L);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) y[i].qs[32 * c + l] = uint8_t(L[64 * c + l] | L[64 * c + 32 + l] << 4);
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    uint8_t L[256];
    quantize_k_levels(x, 31, &y[i], L);
    std::memset(y[i].qh, 0, 32);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        y[i].qs[32 * c + l] = uint8_t((lo & 15) | (hi & 15) << 4);
        y[i].qh[l] |= uint8_t((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
      }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float scale[16], max_abs = 0.f;
    for (int j = 0; j < 16; ++j) {
      scale[j] = fit_symmetric(x + 16 * j, 16);
      max_abs = std::max(max_abs, std::fabs(scale[j]));
    }
    y[i].d = f32_to_f16(max_abs / 127.f);
    const float d = f16_to_f32(y[i].d);
    int L[256];
    for (int j = 0; j < 16; ++j) {
      y[i].scales[j] = int8_t(d > 0.f ? std::clamp(nearest(scale[j] / d), -127, 127) : 0);
      const float ds = d * float(y[i].scales[j]);
      for (int k = 0; k < 16; ++k)
        L[16 * j + k] = (ds != 0.f ? std::clamp(nearest(x[16 * j + k] / ds), -32, 31) : 0) + 32;
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
      const int* Lh = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = uint8_t((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
        ql[l + 32] = uint8_t((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
        qh[l] = uint8_t((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
      }
    }
  }
}

}  // namespace ptllm::ops::q
