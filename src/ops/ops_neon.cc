// NEON (AArch64 ASIMD) row and elementwise kernels: fp32 / bf16 / fp16 dots
// with fp32 x, fp16 widening, SiLU·mul, softmax, axpy and one RMSNorm row.
// Compiled only on aarch64 (src/ops/CMakeLists.txt); ASIMD and the fp16 <->
// fp32 conversions (FCVTL) are baseline there, so no target attribute is
// needed. Declarations and meaning: neon_kernels.h; references: ops.cc,
// elementwise.cc.
#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "ops/neon_kernels.h"

namespace ptllm::ops::neon {
namespace {

// bf16 is the top half of an fp32: widen by shifting into the high 16 bits.
inline float32x4_t bf16x4(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
inline float32x4_t f16x4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

// e^x for 4 lanes, the algorithm of elementwise.cc's exp16: x = n·ln2 + r,
// |r| <= ln2/2, degree-7 Taylor for e^r, times 2^n. The inputs are clamped to
// [-104, 88] so -inf gives 0 and large x stays finite; 2^n (n in [-150, 127])
// is applied as two factors 2^(n/2) and 2^(n - n/2), each a normal float, so
// results in the subnormal range come out as std::exp's do (within ~2 ulp).
inline float32x4_t exp4(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-104.f));
  x = vminq_f32(x, vdupq_n_f32(88.f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
  r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187045e-06f));
  float32x4_t p = vdupq_n_f32(1.f / 5040);
  p = vfmaq_f32(vdupq_n_f32(1.f / 720), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 120), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 24), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 6), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  const int32x4_t ni = vcvtq_s32_f32(n);
  const int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
  const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
  const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
  return vmulq_f32(vmulq_f32(p, s1), s2);
}

}  // namespace

namespace {
// The weight row types of the dots: 4 lanes widened to fp32, and one element.
struct RowF32 {
  using T = float;
  static float32x4_t load4(const float* p) { return vld1q_f32(p); }
  static float at(const float* p, int64_t i) { return p[i]; }
};
struct RowBF16 {
  using T = uint16_t;
  static float32x4_t load4(const uint16_t* p) { return bf16x4(p); }
  static float at(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
};
struct RowF16 {
  using T = uint16_t;
  static float32x4_t load4(const uint16_t* p) { return f16x4(p); }
  static float at(const uint16_t* p, int64_t i) { return f16_to_f32(p[i]); }
};
// Four accumulators (16 elements per step) hide the FMA latency; the
// remainder is scalar, in order.
template <class Row>
float dot_row(const typename Row::T* w, const float* x, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0.f), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, Row::load4(w + i), vld1q_f32(x + i));
    s1 = vfmaq_f32(s1, Row::load4(w + i + 4), vld1q_f32(x + i + 4));
    s2 = vfmaq_f32(s2, Row::load4(w + i + 8), vld1q_f32(x + i + 8));
    s3 = vfmaq_f32(s3, Row::load4(w + i + 12), vld1q_f32(x + i + 12));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, Row::load4(w + i), vld1q_f32(x + i));
  float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < n; ++i) s += Row::at(w, i) * x[i];
  return s;
}
}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return dot_row<RowF32>(a, b, n); }
float dot_bf16(const uint16_t* w, const float* x, int64_t n) { return dot_row<RowBF16>(w, x, n); }
float dot_f16(const uint16_t* w, const float* x, int64_t n) { return dot_row<RowF16>(w, x, n); }

// FCVTL is exact for every fp16 (subnormals, inf, NaN), as f16_to_f32 is.
void widen_f16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, f16x4(src + i));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void silu_mul(float* gate, const float* up, int64_t n) {
  const float32x4_t one = vdupq_n_f32(1.f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t g = vld1q_f32(gate + i);
    const float32x4_t s = vdivq_f32(g, vaddq_f32(one, exp4(vnegq_f32(g))));
    vst1q_f32(gate + i, vmulq_f32(s, vld1q_f32(up + i)));
  }
  // The tail through the same vector code on a padded copy: an element's bits
  // must not depend on its offset (a batch's rows are one buffer).
  if (i < n) {
    float g4[4] = {}, u4[4] = {};
    std::memcpy(g4, gate + i, size_t(n - i) * sizeof(float));
    std::memcpy(u4, up + i, size_t(n - i) * sizeof(float));
    const float32x4_t g = vld1q_f32(g4);
    vst1q_f32(g4, vmulq_f32(vdivq_f32(g, vaddq_f32(one, exp4(vnegq_f32(g)))), vld1q_f32(u4)));
    std::memcpy(gate + i, g4, size_t(n - i) * sizeof(float));
  }
}

void softmax(float* x, int64_t n) {
  float m = -INFINITY;
  int64_t i = 0;
  if (n >= 4) {
    float32x4_t mv = vdupq_n_f32(-INFINITY);
    for (; i + 4 <= n; i += 4) mv = vmaxq_f32(mv, vld1q_f32(x + i));
    m = vmaxvq_f32(mv);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  // All masked (-inf), or inf/NaN present: the reference's own arithmetic
  // (it yields NaN there; the caller decides what that means).
  if (!(m > -INFINITY) || !std::isfinite(m)) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) {
      x[j] = std::exp(x[j] - m);
      s += x[j];
    }
    const float inv = float(1.0 / s);
    for (int64_t j = 0; j < n; ++j) x[j] *= inv;
    return;
  }
  const float32x4_t mb = vdupq_n_f32(m);
  // Sum in double, as the scalar reference does.
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0;
  for (i = 0; i + 4 <= n; i += 4) {
    const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + i), mb));
    vst1q_f32(x + i, e);
    s0 = vaddq_f64(s0, vcvt_f64_f32(vget_low_f32(e)));
    s1 = vaddq_f64(s1, vcvt_high_f64_f32(e));
  }
  double s = vaddvq_f64(vaddq_f64(s0, s1));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = float(1.0 / s);
  const float32x4_t iv = vdupq_n_f32(inv);
  for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_f32(vld1q_f32(x + i), iv));
  for (; i < n; ++i) x[i] *= inv;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const float32x4_t av = vdupq_n_f32(a);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), av, vld1q_f32(x + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);  // the lanes' fused multiply-add
}

// Squares are exact in double (a float times a float), so only the order of
// the double additions differs from the reference (two lanes, then the tail).
void rmsnorm_row(const float* x, const float* w, double eps, int64_t dim, float* out) {
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0;
  int64_t i = 0;
  for (; i + 4 <= dim; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    const float64x2_t lo = vcvt_f64_f32(vget_low_f32(v)), hi = vcvt_high_f64_f32(v);
    s0 = vfmaq_f64(s0, lo, lo);
    s1 = vfmaq_f64(s1, hi, hi);
  }
  double ss = vaddvq_f64(vaddq_f64(s0, s1));
  for (; i < dim; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
  const float32x4_t iv = vdupq_n_f32(inv);
  for (i = 0; i + 4 <= dim; i += 4) vst1q_f32(out + i, vmulq_f32(vmulq_f32(vld1q_f32(x + i), iv), vld1q_f32(w + i)));
  for (; i < dim; ++i) out[i] = x[i] * inv * w[i];
}

}  // namespace ptllm::ops::neon
