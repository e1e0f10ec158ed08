// Fused attention on grouped KIVI storage (declared in grouped_store.h): q·k
// and p·v straight from the packed int8/int4/int2 codes and their fp16
// parameters, never writing a dequantised K or V.
//
// Each inner loop has a scalar reference and AVX2 / AVX-512 variants chosen by
// ops::simd_level() (tests force each level and compare). The SIMD variants
// need head_dim a multiple of 32 for K (each half of the rotate-half pair in
// 16-code blocks) and of 16 for V; other sizes use the scalar loop.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kv/grouped_store.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace ptllm {
namespace {

constexpr int64_t kHalfMax = kMaxHeadDim / 2;

// Per K group: the query folded with the group's per-channel scales and zeros
// (and the softmax scale), for channel pairs (i, i + half):
//   score(t) = sum_i cos_ti (P_i u_i + Q_i u_{i+h} + C1_i) + sin_ti (X_i u_i - Y_i u_{i+h} + C2_i)
struct KeyCoef {
  alignas(64) float P[kHalfMax], Q[kHalfMax], X[kHalfMax], Y[kHalfMax], C1[kHalfMax], C2[kHalfMax];
};

void fold_group(const float* q, const kivi::AffineParams* p, int64_t half, float scale, KeyCoef& c) {
  for (int64_t i = 0; i < half; ++i) {
    const kivi::WideParams lo = kivi::widen(p[i]), hi = kivi::widen(p[i + half]);
    const float ql = q[i] * scale, qh = q[i + half] * scale;
    c.P[i] = ql * lo.scale;
    c.Q[i] = qh * hi.scale;
    c.X[i] = qh * lo.scale;
    c.Y[i] = ql * hi.scale;
    c.C1[i] = ql * lo.zero + qh * hi.zero;
    c.C2[i] = qh * lo.zero - ql * hi.zero;
  }
}

// The same with the fp16 parameters widened by F16C (one instruction each
// instead of the portable bit manipulation): used with the SIMD kernels.
__attribute__((target("avx2,fma,f16c"))) void fold_group_f16c(const float* q, const kivi::AffineParams* p,
                                                              int64_t half, float scale, KeyCoef& c) {
  for (int64_t i = 0; i < half; ++i) {
    const float ls = _cvtsh_ss(p[i].scale.bits()), lz = _cvtsh_ss(p[i].zero.bits());
    const float hs = _cvtsh_ss(p[i + half].scale.bits()), hz = _cvtsh_ss(p[i + half].zero.bits());
    const float ql = q[i] * scale, qh = q[i + half] * scale;
    c.P[i] = ql * ls;
    c.Q[i] = qh * hs;
    c.X[i] = qh * ls;
    c.Y[i] = ql * hs;
    c.C1[i] = ql * lz + qh * hz;
    c.C2[i] = qh * lz - ql * hz;
  }
}

// Quantised tokens t0 .. t0+n-1 of one head: codes at rows ring.phys(t) of
// `base`; cos/sin rows and scores start at the first of them.
struct TokenRun {
  const uint8_t* base;
  size_t row;
  RowRing ring;
  int64_t t0, n;
};

// ---- scalar reference ----

void key_run_scalar(const TokenRun& run, kivi::QuantRange r, int64_t hd, const KeyCoef& c, const float* kcos,
                    const float* ksin, float* scores) {
  const int64_t half = hd / 2;
  uint8_t tmp[kMaxHeadDim];
  for (int64_t j = 0; j < run.n; ++j) {
    const uint8_t* u = kivi::unpack_row(run.base + size_t(run.ring.phys(run.t0 + j)) * run.row, hd, r, tmp);
    const float* cs = kcos + j * half;
    const float* sn = ksin + j * half;
    float acc = 0.f;
    for (int64_t i = 0; i < half; ++i) {
      const float ul = float(u[i]), uh = float(u[i + half]);
      const float a = c.P[i] * ul + c.Q[i] * uh + c.C1[i];
      const float b = c.X[i] * ul - c.Y[i] * uh + c.C2[i];
      acc += cs[i] * a + sn[i] * b;
    }
    scores[j] = acc;
  }
}

void value_run_scalar(const TokenRun& run, kivi::QuantRange r, int64_t hd, const kivi::AffineParams* params,
                      const float* p, float* acc, float& bias) {
  uint8_t tmp[kMaxHeadDim];
  for (int64_t j = 0; j < run.n; ++j) {
    if (p[j] == 0.f) continue;
    const int64_t row = run.ring.phys(run.t0 + j);
    const kivi::WideParams w = kivi::widen(params[row]);
    const uint8_t* u = kivi::unpack_row(run.base + size_t(row) * run.row, hd, r, tmp);
    const float ps = p[j] * w.scale;
    for (int64_t i = 0; i < hd; ++i) acc[i] += ps * float(u[i]);
    bias += p[j] * w.zero;
  }
}

// ---- SIMD: 16 codes of a row as bytes, elements [16 b, 16 b + 16) ----

template <int BITS>
__attribute__((target("avx2,fma"), always_inline)) inline __m128i codes16(const uint8_t* row, int64_t b) {
  if constexpr (BITS == 8) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * b));
  } else if constexpr (BITS == 4) {
    // Byte j: element 2j low nibble, 2j+1 high nibble.
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * b));
    const __m128i m = _mm_set1_epi8(0x0f);
    return _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
  } else {
    // Byte j: element 4j+k in bits 2k..2k+1.
    uint32_t w;
    std::memcpy(&w, row + 4 * b, 4);
    const __m128i x = _mm_cvtsi32_si128(int(w));
    const __m128i m = _mm_set1_epi8(0x03);
    const __m128i a0 = _mm_and_si128(x, m), a1 = _mm_and_si128(_mm_srli_epi16(x, 2), m);
    const __m128i a2 = _mm_and_si128(_mm_srli_epi16(x, 4), m), a3 = _mm_and_si128(_mm_srli_epi16(x, 6), m);
    return _mm_unpacklo_epi16(_mm_unpacklo_epi8(a0, a1), _mm_unpacklo_epi8(a2, a3));
  }
}

// ---- AVX-512: NB blocks of 16 channels per half (K) / per row (V) ----

template <int BITS, int NB>
__attribute__((target("avx512f,avx2,fma"))) void key_run_avx512(const TokenRun& run, const KeyCoef& c,
                                                                const float* kcos, const float* ksin,
                                                                float* scores) {
  constexpr int64_t half = 16 * NB;
  __m512 P[NB], Q[NB], X[NB], Y[NB], C1[NB], C2[NB];
  for (int b = 0; b < NB; ++b) {
    P[b] = _mm512_load_ps(c.P + 16 * b);
    Q[b] = _mm512_load_ps(c.Q + 16 * b);
    X[b] = _mm512_load_ps(c.X + 16 * b);
    Y[b] = _mm512_load_ps(c.Y + 16 * b);
    C1[b] = _mm512_load_ps(c.C1 + 16 * b);
    C2[b] = _mm512_load_ps(c.C2 + 16 * b);
  }
  const uint8_t* base = run.base;
  const size_t rb = run.row;
  const int64_t cap = run.ring.cap, n = run.n;
  int64_t pr = run.ring.phys(run.t0);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = base + size_t(pr) * rb;
    if (++pr == cap) pr = 0;
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      const __m512 ul = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes16<BITS>(row, b)));
      const __m512 uh = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes16<BITS>(row, NB + b)));
      const __m512 a = _mm512_fmadd_ps(P[b], ul, _mm512_fmadd_ps(Q[b], uh, C1[b]));
      const __m512 bb = _mm512_fmadd_ps(X[b], ul, _mm512_fnmadd_ps(Y[b], uh, C2[b]));
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(kcos + j * half + 16 * b), a, acc);
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(ksin + j * half + 16 * b), bb, acc);
    }
    scores[j] = _mm512_reduce_add_ps(acc);
  }
}

template <int BITS, int NB>
__attribute__((target("avx512f,avx2,fma,f16c"))) void value_run_avx512(const TokenRun& run,
                                                                  const kivi::AffineParams* params, const float* p,
                                                                  float* acc_out, float& bias) {
  // Locals, not references: a store through `bias` every token would chain
  // the loop on store-to-load forwarding.
  __m512 acc[NB];
  for (int b = 0; b < NB; ++b) acc[b] = _mm512_loadu_ps(acc_out + 16 * b);
  float b_acc = bias;
  const uint8_t* base = run.base;
  const size_t rb = run.row;
  const int64_t cap = run.ring.cap, n = run.n;
  int64_t pr = run.ring.phys(run.t0);
  for (int64_t j = 0; j < n; ++j, pr = pr + 1 == cap ? 0 : pr + 1) {
    if (p[j] == 0.f) continue;
    const float ws = _cvtsh_ss(params[pr].scale.bits()), wz = _cvtsh_ss(params[pr].zero.bits());
    const __m512 ps = _mm512_set1_ps(p[j] * ws);
    b_acc += p[j] * wz;
    const uint8_t* row = base + size_t(pr) * rb;
    for (int b = 0; b < NB; ++b)
      acc[b] = _mm512_fmadd_ps(ps, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes16<BITS>(row, b))), acc[b]);
  }
  for (int b = 0; b < NB; ++b) _mm512_storeu_ps(acc_out + 16 * b, acc[b]);
  bias = b_acc;
}

// ---- AVX2: the same 16-code blocks as two 8-lane halves ----

__attribute__((target("avx2,fma"), always_inline)) inline void widen16(__m128i x, __m256& lo, __m256& hi) {
  lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)));
}

__attribute__((target("avx2,fma"), always_inline)) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int BITS, int NB>
__attribute__((target("avx2,fma"))) void key_run_avx2(const TokenRun& run, const KeyCoef& c, const float* kcos,
                                                      const float* ksin, float* scores) {
  constexpr int64_t half = 16 * NB;
  const uint8_t* base = run.base;
  const size_t rb = run.row;
  const int64_t cap = run.ring.cap, n = run.n;
  int64_t pr = run.ring.phys(run.t0);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = base + size_t(pr) * rb;
    if (++pr == cap) pr = 0;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      __m256 ul[2], uh[2];
      widen16(codes16<BITS>(row, b), ul[0], ul[1]);
      widen16(codes16<BITS>(row, NB + b), uh[0], uh[1]);
      for (int k = 0; k < 2; ++k) {
        const int64_t i = 16 * b + 8 * k;
        const __m256 a = _mm256_fmadd_ps(_mm256_load_ps(c.P + i), ul[k],
                                         _mm256_fmadd_ps(_mm256_load_ps(c.Q + i), uh[k], _mm256_load_ps(c.C1 + i)));
        const __m256 bb = _mm256_fmadd_ps(_mm256_load_ps(c.X + i), ul[k],
                                          _mm256_fnmadd_ps(_mm256_load_ps(c.Y + i), uh[k], _mm256_load_ps(c.C2 + i)));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(kcos + j * half + i), a, acc);
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(ksin + j * half + i), bb, acc);
      }
    }
    scores[j] = hsum8(acc);
  }
}

template <int BITS, int NB>
__attribute__((target("avx2,fma,f16c"))) void value_run_avx2(const TokenRun& run, const kivi::AffineParams* params,
                                                       const float* p, float* acc_out, float& bias) {
  __m256 acc[2 * NB];
  for (int b = 0; b < 2 * NB; ++b) acc[b] = _mm256_loadu_ps(acc_out + 8 * b);
  float b_acc = bias;
  const uint8_t* base = run.base;
  const size_t rb = run.row;
  const int64_t cap = run.ring.cap, n = run.n;
  int64_t pr = run.ring.phys(run.t0);
  for (int64_t j = 0; j < n; ++j, pr = pr + 1 == cap ? 0 : pr + 1) {
    if (p[j] == 0.f) continue;
    const float ws = _cvtsh_ss(params[pr].scale.bits()), wz = _cvtsh_ss(params[pr].zero.bits());
    const __m256 ps = _mm256_set1_ps(p[j] * ws);
    b_acc += p[j] * wz;
    const uint8_t* row = base + size_t(pr) * rb;
    for (int b = 0; b < NB; ++b) {
      __m256 u[2];
      widen16(codes16<BITS>(row, b), u[0], u[1]);
      acc[2 * b] = _mm256_fmadd_ps(ps, u[0], acc[2 * b]);
      acc[2 * b + 1] = _mm256_fmadd_ps(ps, u[1], acc[2 * b + 1]);
    }
  }
  for (int b = 0; b < 2 * NB; ++b) _mm256_storeu_ps(acc_out + 8 * b, acc[b]);
  bias = b_acc;
}

// ---- pre-RoPE fp32 rows (sinks, residual): scale * q . R(t) k ----

void rot_rows_scalar(const float* q, const float* k, int64_t n, int64_t hd, const float* kcos, const float* ksin,
                     float scale, float* scores) {
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = k + t * hd;
    const float* c = kcos + t * half;
    const float* sn = ksin + t * half;
    float acc = 0.f;
    for (int64_t i = 0; i < half; ++i)
      acc += c[i] * (q[i] * kt[i] + q[i + half] * kt[i + half]) + sn[i] * (q[i + half] * kt[i] - q[i] * kt[i + half]);
    scores[t] = scale * acc;
  }
}

template <int NB>
__attribute__((target("avx512f,avx2,fma"))) void rot_rows_avx512(const float* q, const float* k, int64_t n,
                                                                 const float* kcos, const float* ksin, float scale,
                                                                 float* scores) {
  constexpr int64_t half = 16 * NB, hd = 2 * half;
  __m512 ql[NB], qh[NB];
  for (int b = 0; b < NB; ++b) {
    ql[b] = _mm512_loadu_ps(q + 16 * b);
    qh[b] = _mm512_loadu_ps(q + half + 16 * b);
  }
  for (int64_t t = 0; t < n; ++t) {
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      const __m512 kl = _mm512_loadu_ps(k + t * hd + 16 * b), kh = _mm512_loadu_ps(k + t * hd + half + 16 * b);
      const __m512 a = _mm512_fmadd_ps(qh[b], kh, _mm512_mul_ps(ql[b], kl));
      const __m512 bb = _mm512_fnmadd_ps(ql[b], kh, _mm512_mul_ps(qh[b], kl));
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(kcos + t * half + 16 * b), a, acc);
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(ksin + t * half + 16 * b), bb, acc);
    }
    scores[t] = scale * _mm512_reduce_add_ps(acc);
  }
}

template <int NB>
__attribute__((target("avx2,fma"))) void rot_rows_avx2(const float* q, const float* k, int64_t n, const float* kcos,
                                                      const float* ksin, float scale, float* scores) {
  constexpr int64_t half = 8 * NB, hd = 2 * half;
  for (int64_t t = 0; t < n; ++t) {
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      const __m256 ql = _mm256_loadu_ps(q + 8 * b), qh = _mm256_loadu_ps(q + half + 8 * b);
      const __m256 kl = _mm256_loadu_ps(k + t * hd + 8 * b), kh = _mm256_loadu_ps(k + t * hd + half + 8 * b);
      const __m256 a = _mm256_fmadd_ps(qh, kh, _mm256_mul_ps(ql, kl));
      const __m256 bb = _mm256_fnmadd_ps(ql, kh, _mm256_mul_ps(qh, kl));
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(kcos + t * half + 8 * b), a, acc);
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(ksin + t * half + 8 * b), bb, acc);
    }
    scores[t] = scale * hsum8(acc);
  }
}

// scores[t] = scale * q . R(t) k_t for n consecutive fp32 rows k [n, hd] with
// cos/sin rows [n, hd/2] starting at the same slot.
void rotated_rows(const float* q, const float* k, int64_t n, int64_t hd, const float* kcos, const float* ksin,
                  float scale, float* scores) {
  if (n <= 0) return;
  const ops::SimdLevel l = ops::simd_level();
  const int64_t half = hd / 2;
  if (l == ops::SimdLevel::Avx512) {
    switch (half) {
      case 16: return rot_rows_avx512<1>(q, k, n, kcos, ksin, scale, scores);
      case 32: return rot_rows_avx512<2>(q, k, n, kcos, ksin, scale, scores);
      case 64: return rot_rows_avx512<4>(q, k, n, kcos, ksin, scale, scores);
      default: break;
    }
  }
  if (l != ops::SimdLevel::Scalar) {
    switch (half) {
      case 8: return rot_rows_avx2<1>(q, k, n, kcos, ksin, scale, scores);
      case 16: return rot_rows_avx2<2>(q, k, n, kcos, ksin, scale, scores);
      case 32: return rot_rows_avx2<4>(q, k, n, kcos, ksin, scale, scores);
      case 64: return rot_rows_avx2<8>(q, k, n, kcos, ksin, scale, scores);
      default: break;
    }
  }
  rot_rows_scalar(q, k, n, hd, kcos, ksin, scale, scores);
}

// ---- dispatch ----

using KeyRunFn = void (*)(const TokenRun&, const KeyCoef&, const float*, const float*, float*);
using ValueRunFn = void (*)(const TokenRun&, const kivi::AffineParams*, const float*, float*, float&);

template <int BITS>
KeyRunFn key_kernel(ops::SimdLevel level, int64_t half) {
  const bool a512 = level == ops::SimdLevel::Avx512, a2 = level != ops::SimdLevel::Scalar;
  switch (half) {
    case 16: return a512 ? key_run_avx512<BITS, 1> : a2 ? key_run_avx2<BITS, 1> : nullptr;
    case 32: return a512 ? key_run_avx512<BITS, 2> : a2 ? key_run_avx2<BITS, 2> : nullptr;
    case 64: return a512 ? key_run_avx512<BITS, 4> : a2 ? key_run_avx2<BITS, 4> : nullptr;
    case 128: return a512 ? key_run_avx512<BITS, 8> : a2 ? key_run_avx2<BITS, 8> : nullptr;
    default: return nullptr;
  }
}

template <int BITS>
ValueRunFn value_kernel(ops::SimdLevel level, int64_t hd) {
  const bool a512 = level == ops::SimdLevel::Avx512, a2 = level != ops::SimdLevel::Scalar;
  switch (hd) {
    case 16: return a512 ? value_run_avx512<BITS, 1> : a2 ? value_run_avx2<BITS, 1> : nullptr;
    case 32: return a512 ? value_run_avx512<BITS, 2> : a2 ? value_run_avx2<BITS, 2> : nullptr;
    case 64: return a512 ? value_run_avx512<BITS, 4> : a2 ? value_run_avx2<BITS, 4> : nullptr;
    case 128: return a512 ? value_run_avx512<BITS, 8> : a2 ? value_run_avx2<BITS, 8> : nullptr;
    case 256: return a512 ? value_run_avx512<BITS, 16> : a2 ? value_run_avx2<BITS, 16> : nullptr;
    default: return nullptr;
  }
}

KeyRunFn pick_key(kivi::QuantRange r, int64_t half) {
  const ops::SimdLevel l = ops::simd_level();
  return r.bits == 8 ? key_kernel<8>(l, half) : r.bits == 4 ? key_kernel<4>(l, half) : key_kernel<2>(l, half);
}
ValueRunFn pick_value(kivi::QuantRange r, int64_t hd) {
  const ops::SimdLevel l = ops::simd_level();
  return r.bits == 8 ? value_kernel<8>(l, hd) : r.bits == 4 ? value_kernel<4>(l, hd) : value_kernel<2>(l, hd);
}

}  // namespace

void fused_key_scores(const GroupedKiviStore& K, int64_t head, const float* q, int64_t begin, int64_t end,
                      const float* kcos, const float* ksin, float scale, float* scores) {
  const int64_t hd = K.head_dim(), half = hd / 2;
  const int64_t ns = K.n_sink(), nq = K.n_quant();
  // Sinks: fp32.
  const float* sk = K.sink_rows(head);
  const int64_t se = std::min(end, ns);
  if (begin < se)
    rotated_rows(q, sk + begin * hd, se - begin, hd, kcos + begin * half, ksin + begin * half, scale, scores + begin);
  // Quantised groups: scales and zeros folded into the query once per group.
  const int64_t qb = std::max<int64_t>(begin - ns, 0), qe = std::min(end - ns, nq);  // quantised indices
  if (qb < qe) {
    const KeyRunFn simd = pick_key(K.range(), half);
    KeyCoef coef;
    const auto& sizes = K.group_sizes();
    int64_t g0 = 0;  // first token of group g
    for (size_t g = 0; g < sizes.size() && g0 < qe; g0 += sizes[g], ++g) {
      const int64_t a = std::max(g0, qb), b = std::min(g0 + sizes[g], qe);
      if (a >= b) continue;
      if (simd)
        fold_group_f16c(q, K.group_params(head, int64_t(g)), half, scale, coef);
      else
        fold_group(q, K.group_params(head, int64_t(g)), half, scale, coef);
      const TokenRun run{K.code_base(head), K.row_bytes(), K.ring(), a, b - a};
      const int64_t slot = ns + a;
      if (simd)
        simd(run, coef, kcos + slot * half, ksin + slot * half, scores + slot);
      else
        key_run_scalar(run, K.range(), hd, coef, kcos + slot * half, ksin + slot * half, scores + slot);
    }
  }
  // Residual: fp32.
  const float* rk = K.resid_rows(head);
  const int64_t rb = std::max(begin, ns + nq);
  if (rb < end)
    rotated_rows(q, rk + (rb - ns - nq) * hd, end - rb, hd, kcos + rb * half, ksin + rb * half, scale, scores + rb);
}

void fused_value_sum(const GroupedKiviStore& V, int64_t head, const float* p, int64_t len, float* out) {
  const int64_t hd = V.head_dim(), ns = V.n_sink(), nq = V.n_quant();
  std::fill(out, out + hd, 0.f);
  ops::weighted_sum_rows(p, V.sink_rows(head), std::min(len, ns), hd, out);
  // sum_t p_t (s_t u_t + z_t) = sum_t (p_t s_t) u_t + sum_t p_t z_t
  const int64_t qend = std::min(nq, len - ns);
  if (qend > 0) {
    alignas(64) float acc[kMaxHeadDim] = {};
    float bias = 0.f;
    const TokenRun run{V.code_base(head), V.row_bytes(), V.ring(), 0, qend};
    if (const ValueRunFn simd = pick_value(V.range(), hd))
      simd(run, V.token_param_base(head), p + ns, acc, bias);
    else
      value_run_scalar(run, V.range(), hd, V.token_param_base(head), p + ns, acc, bias);
    for (int64_t i = 0; i < hd; ++i) out[i] += acc[i] + bias;
  }
  if (len > ns + nq) ops::weighted_sum_rows(p + ns + nq, V.resid_rows(head), len - ns - nq, hd, out);
}

}  // namespace ptllm
