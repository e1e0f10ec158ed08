// The per-token work of sampling over a vocabulary (sampling/sampler.cc): the argmax
// of greedy decoding, and the softmax weights of temperature sampling. At a 32,000-
// token vocabulary these were ~0.1 ms (argmax) and ~0.2 ms (weights through the libm
// exp, then a sequential sum) per token on one core: a tenth to a fifth of a 27M
// model's decode step (kernels_bench BM_Sample, docs/SERVER.md "Sampling, session 23").
//
// Both give the same result at every SIMD level and on every platform, because a seed
// must reproduce a run anywhere (sampling/sampler.h): argmax is exact by nature, and
// exp_weights computes e^t with its own routine from IEEE operations only (add,
// subtract, multiply, fused multiply-add) and sums in a fixed order. This file is
// compiled with -ffp-contract=off (CMakeLists.txt), so the scalar reference's separate
// multiplies and adds are not fused differently from the vector code's.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops/dispatch.h"
#include "ops/ops.h"

#if PTLLM_X86
#include <immintrin.h>
#endif

namespace ptllm::ops {
namespace {

using detail::pick;

// e^t for t in [kExpMin, 0]: t = k ln2 + r with k = round(t / ln2) (the 1.5 * 2^52
// shift rounds to nearest even), ln2 split in two so k ln2 is exact to ~2^-100, then
// a degree-13 Taylor polynomial of e^r (|r| <= ln2 / 2: truncation < 1e-17
// relative) and the exponent 2^k built from its bits. Below kExpMin the weight is 0
// (e^-700 against a maximum of 1 draws nothing).
constexpr double kExpMin = -700.0;
constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2Hi = 0.693147180369123816490;      // the high bits of ln 2
constexpr double kLn2Lo = 1.90821492927058770002e-10;   // ln 2 - kLn2Hi
constexpr double kShift = 6755399441055744.0;           // 1.5 * 2^52
constexpr double kInvFact[14] = {1.0,
                                 1.0,
                                 1.0 / 2,
                                 1.0 / 6,
                                 1.0 / 24,
                                 1.0 / 120,
                                 1.0 / 720,
                                 1.0 / 5040,
                                 1.0 / 40320,
                                 1.0 / 362880,
                                 1.0 / 3628800,
                                 1.0 / 39916800,
                                 1.0 / 479001600,
                                 1.0 / 6227020800.0};

double exp_scalar(double t) {
  if (!(t >= kExpMin)) return 0.0;
  const double kd = std::fma(t, kLog2e, kShift);
  const double k = kd - kShift;
  double r = std::fma(-k, kLn2Hi, t);
  r = std::fma(-k, kLn2Lo, r);
  double p = kInvFact[13];
  for (int i = 12; i >= 0; --i) p = std::fma(p, r, kInvFact[i]);
  const int64_t bits = (int64_t(k) + 1023) << 52;
  double two_k;
  std::memcpy(&two_k, &bits, sizeof two_k);
  return p * two_k;
}

// The 8 partial sums (lane j over i = j mod 8, in order) added in one fixed tree.
double add_partials(const double* s) { return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])); }

// The pieces every variant ends with (the vector ones on their lanes' results and the
// elements past the last full vector), so that all of them compute the same thing:
// the largest of `lanes` partial maxima and x[i..n) (`x > m`: a NaN never wins) ...
float max_rest(const float* lanes, int n_lanes, const float* x, int64_t i, int64_t n) {
  float m = -INFINITY;
  for (int j = 0; j < n_lanes; ++j)
    if (lanes[j] > m) m = lanes[j];
  for (; i < n; ++i)
    if (x[i] > m) m = x[i];
  return m;
}

// ... the first index in [i, n) holding m (0 when none: every value NaN) ...
int64_t first_equal(const float* x, int64_t i, int64_t n, float m) {
  for (; i < n; ++i)
    if (x[i] == m) return i;
  return 0;
}

// ... and the weights of x[i..n) added to the 8 partial sums (lane j: i = j mod 8), then
// the partials' fixed tree.
double weights_rest(const float* x, int64_t i, int64_t n, double m, double s, double* w, double* part) {
  for (; i < n; ++i) {
    w[i] = exp_scalar((double(x[i]) - m) * s);
    part[i % 8] += w[i];
  }
  return add_partials(part);
}

int64_t argmax_scalar(const float* x, int64_t n) { return first_equal(x, 0, n, max_rest(nullptr, 0, x, 0, n)); }

double exp_weights_scalar(const float* x, int64_t n, double m, double s, double* w) {
  double part[8] = {};
  return weights_rest(x, 0, n, m, s, w, part);
}

#if PTLLM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")

// exp_scalar's operations on 4 lanes.
inline __m256d exp4d(__m256d t) {
  const __m256d ok = _mm256_cmp_pd(t, _mm256_set1_pd(kExpMin), _CMP_GE_OQ);
  t = _mm256_max_pd(t, _mm256_set1_pd(kExpMin));
  const __m256d kd = _mm256_fmadd_pd(t, _mm256_set1_pd(kLog2e), _mm256_set1_pd(kShift));
  const __m256d k = _mm256_sub_pd(kd, _mm256_set1_pd(kShift));
  __m256d r = _mm256_fnmadd_pd(k, _mm256_set1_pd(kLn2Hi), t);
  r = _mm256_fnmadd_pd(k, _mm256_set1_pd(kLn2Lo), r);
  __m256d p = _mm256_set1_pd(kInvFact[13]);
  for (int i = 12; i >= 0; --i) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kInvFact[i]));
  // kd's low mantissa bits hold k (two's complement): k + 1023 into the exponent field.
  const __m256i ki = _mm256_sub_epi64(_mm256_castpd_si256(kd), _mm256_castpd_si256(_mm256_set1_pd(kShift)));
  const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(ki, _mm256_set1_epi64x(1023)), 52);
  return _mm256_and_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(bits)), ok);
}

int64_t argmax_avx2(const float* x, int64_t n) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  // max(x, m) keeps m where x is NaN, as the scalar `x > m` test does.
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + i), mv);
  alignas(32) float l[8];
  _mm256_store_ps(l, mv);
  const float m = max_rest(l, 8, x, i, n);
  const __m256 mm = _mm256_set1_ps(m);
  for (i = 0; i + 8 <= n; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mm, _CMP_EQ_OQ));
    if (mask) return i + __builtin_ctz(unsigned(mask));
  }
  return first_equal(x, i, n, m);
}

double exp_weights_avx2(const float* x, int64_t n, double m, double s, double* w) {
  const __m256d mv = _mm256_set1_pd(m), sv = _mm256_set1_pd(s);
  __m256d p0 = _mm256_setzero_pd(), p1 = _mm256_setzero_pd();  // lanes 0-3 and 4-7 of the 8 partials
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256d w0 = exp4d(_mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(xv)), mv), sv));
    const __m256d w1 = exp4d(_mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(xv, 1)), mv), sv));
    _mm256_storeu_pd(w + i, w0);
    _mm256_storeu_pd(w + i + 4, w1);
    p0 = _mm256_add_pd(p0, w0);
    p1 = _mm256_add_pd(p1, w1);
  }
  alignas(32) double part[8];
  _mm256_store_pd(part, p0);
  _mm256_store_pd(part + 4, p1);
  return weights_rest(x, i, n, m, s, w, part);
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
// GCC 12's avx512fintrin.h builds the unmasked max / cvtps_pd / slli_epi64 from an
// _mm512_undefined_* operand, which -Wmaybe-uninitialized reports inside the header.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

inline __m512d exp8d(__m512d t) {
  const __mmask8 ok = _mm512_cmp_pd_mask(t, _mm512_set1_pd(kExpMin), _CMP_GE_OQ);
  t = _mm512_max_pd(t, _mm512_set1_pd(kExpMin));
  const __m512d kd = _mm512_fmadd_pd(t, _mm512_set1_pd(kLog2e), _mm512_set1_pd(kShift));
  const __m512d k = _mm512_sub_pd(kd, _mm512_set1_pd(kShift));
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(kLn2Hi), t);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(kLn2Lo), r);
  __m512d p = _mm512_set1_pd(kInvFact[13]);
  for (int i = 12; i >= 0; --i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[i]));
  const __m512i ki = _mm512_sub_epi64(_mm512_castpd_si512(kd), _mm512_castpd_si512(_mm512_set1_pd(kShift)));
  const __m512i bits = _mm512_slli_epi64(_mm512_add_epi64(ki, _mm512_set1_epi64(1023)), 52);
  return _mm512_maskz_mul_pd(ok, p, _mm512_castsi512_pd(bits));
}

int64_t argmax_avx512(const float* x, int64_t n) {
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(_mm512_loadu_ps(x + i), mv);
  alignas(64) float l[16];
  _mm512_store_ps(l, mv);
  const float m = max_rest(l, 16, x, i, n);
  const __m512 mm = _mm512_set1_ps(m);
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mm, _CMP_EQ_OQ);
    if (mask) return i + __builtin_ctz(unsigned(mask));
  }
  return first_equal(x, i, n, m);
}

double exp_weights_avx512(const float* x, int64_t n, double m, double s, double* w) {
  const __m512d mv = _mm512_set1_pd(m), sv = _mm512_set1_pd(s);
  __m512d acc = _mm512_setzero_pd();  // the 8 partials
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d wv = exp8d(_mm512_mul_pd(_mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)), mv), sv));
    _mm512_storeu_pd(w + i, wv);
    acc = _mm512_add_pd(acc, wv);
  }
  alignas(64) double part[8];
  _mm512_store_pd(part, acc);
  return weights_rest(x, i, n, m, s, w, part);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif  // PTLLM_X86

}  // namespace

int64_t argmax(const float* x, int64_t n) {
  return pick(argmax_scalar, PTLLM_X86_FN(argmax_avx2), PTLLM_X86_FN(argmax_avx512))(x, n);
}

double exp_weights(const float* x, int64_t n, double m, double s, double* w) {
  return pick(exp_weights_scalar, PTLLM_X86_FN(exp_weights_avx2), PTLLM_X86_FN(exp_weights_avx512))(x, n, m, s, w);
}

double exp_reference(double t) { return exp_scalar(t); }

}  // namespace ptllm::ops
