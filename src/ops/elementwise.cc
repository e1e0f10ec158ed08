// Elementwise and per-row kernels: RMSNorm, SiLU·mul, softmax, axpy. Scalar
// references, AVX2 and AVX-512 variants (a vector e^x for softmax and SiLU).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/dispatch.h"
#include "ops/neon_kernels.h"
#include "ops/ops.h"

#if PTLLM_X86
#include "ops/simd_util.h"
#endif

namespace ptllm::ops {
namespace {

using detail::pick;

void silu_mul_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void softmax_scalar(float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = float(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

#if PTLLM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")

// e^x for 8 lanes, exp16's algorithm (below). AVX2 has no scalef, so 2^n
// (n in [-150, 127]) is applied as two factors 2^(n/2) and 2^(n - n/2), each a
// normal float, as ops_neon.cc's exp4 does: results in the subnormal range
// come out as std::exp's do (within ~2 ulp).
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// The last < 8 elements go through the same vector code (masked loads and
// stores): an element's result must not depend on where it sits (a batch's rows are
// one buffer; batch invariance needs each row's bits as when it is alone).
inline __m256i tail_mask8(int64_t left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(left)), idx);
}

void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = tail_mask8(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_maskstore_ps(gate + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(up + i, m)));
  }
}

void softmax_avx2(float* x, int64_t n) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = tail_mask8(n - i);
    mv = _mm256_blendv_ps(mv, _mm256_max_ps(mv, _mm256_maskload_ps(x + i, k)), _mm256_castsi256_ps(k));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  float m = -INFINITY;
  for (float l : lanes) m = std::max(m, l);
  if (!(m > -INFINITY) || !std::isfinite(m)) return softmax_scalar(x, n);  // all masked, or inf/NaN
  const __m256 mb = _mm256_set1_ps(m);
  // Sum in double, as the scalar reference does.
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = tail_mask8(n - i);
    const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), mb)), _mm256_castsi256_ps(k));
    _mm256_maskstore_ps(x + i, k, e);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double parts[4];
  _mm256_store_pd(parts, _mm256_add_pd(s0, s1));
  const double s = (parts[0] + parts[1]) + (parts[2] + parts[3]);
  const __m256 iv = _mm256_set1_ps(float(1.0 / s));
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = tail_mask8(n - i);
    _mm256_maskstore_ps(x + i, k, _mm256_mul_ps(_mm256_maskload_ps(x + i, k), iv));
  }
}

void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = tail_mask8(n - i);
    _mm256_maskstore_ps(y + i, k, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, k), _mm256_maskload_ps(y + i, k)));
  }
}

#pragma GCC pop_options
#endif  // PTLLM_X86

#if PTLLM_X86
#pragma GCC push_options
#pragma GCC target("avx512f,fma,f16c")

// e^x for 16 lanes: x = n·ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r
// (truncation < 1e-8 relative), scaled by 2^n. Inputs are clamped so -inf
// gives 0 and large x stays finite; within ~2 ulp of std::exp.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }

void silu_mul_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void softmax_avx512(float* x, int64_t n) {
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    mv = _mm512_mask_max_ps(mv, k, mv, _mm512_maskz_loadu_ps(k, x + i));
  }
  const float m = _mm512_reduce_max_ps(mv);
  if (!(m > -INFINITY) || !std::isfinite(m)) return softmax_scalar(x, n);  // all masked, or inf/NaN
  const __m512 mb = _mm512_set1_ps(m);
  // Sum in double, as the scalar reference does.
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mb)));
    _mm512_mask_storeu_ps(x + i, k, e);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  const double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const __m512 inv = _mm512_set1_ps(float(1.0 / s));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}

// RMSNorm of one row: the sum of squares in double (two chains of 8), the
// scale as the reference computes it, then (x * inv) * w per element.
void rmsnorm_row_avx512(const float* xr, const float* w, double eps, int64_t dim, float* o) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 x = _mm512_maskz_loadu_ps(tail_mask(dim - i), xr + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    s0 = _mm512_fmadd_pd(lo, lo, s0);
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  const double ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const __m512 inv = _mm512_set1_ps(float(1.0 / std::sqrt(ss / double(dim) + eps)));
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 k = tail_mask(dim - i);
    _mm512_mask_storeu_ps(o + i, k,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, xr + i), inv), _mm512_maskz_loadu_ps(k, w + i)));
  }
}

void axpy_avx512(float a, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k,
                          _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i)));
  }
}

#pragma GCC pop_options
#endif  // PTLLM_X86

}  // namespace

namespace {
// One row: sum of squares in double, then x * inv * w in fp32.
void rmsnorm_row_scalar(const float* xr, const float* w, double eps, int64_t dim, float* o) {
  double ss = 0;
  for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
  const float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
  for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
}
}  // namespace

void rmsnorm(const float* x, const TensorView& weight, double eps, int64_t n, int64_t dim, float* out) {
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(dim));
  to_f32(weight.data, weight.dtype, w.data(), dim);
  const auto row =
      pick(rmsnorm_row_scalar, nullptr, PTLLM_X86_FN(rmsnorm_row_avx512), PTLLM_NEON_FN(neon::rmsnorm_row));
  // Rows are independent (each is the one-row result): a prefill's rows are
  // split among the threads, which would otherwise wait for this one.
  const float* wp = w.data();
#pragma omp parallel for schedule(static) if (n > 1 && n * dim >= parallel_min_work())
  for (int64_t t = 0; t < n; ++t) row(x + t * dim, wp, eps, dim, out + t * dim);
}

void silu_mul(float* gate, const float* up, int64_t n) {
  pick(silu_mul_scalar, PTLLM_X86_FN(silu_mul_avx2), PTLLM_X86_FN(silu_mul_avx512), PTLLM_NEON_FN(neon::silu_mul))(gate, up, n);
}

void softmax(float* x, int64_t n) {
  pick(softmax_scalar, PTLLM_X86_FN(softmax_avx2), PTLLM_X86_FN(softmax_avx512), PTLLM_NEON_FN(neon::softmax))(x, n);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  pick(axpy_scalar, PTLLM_X86_FN(axpy_avx2), PTLLM_X86_FN(axpy_avx512), PTLLM_NEON_FN(neon::axpy))(a, x, y, n);
}

}  // namespace ptllm::ops
