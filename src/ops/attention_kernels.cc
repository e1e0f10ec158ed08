// Attention kernels over fp32 rows of one K or V head: scores q·k (keys
// stored rotated, or pre-RoPE keys turned by a per-slot cos/sin table) and the
// softmax-weighted sum of value rows. Scalar references; AVX2 / AVX-512
// variants for the head_dims models use (others take the reference).
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#if PTLLM_X86
#include "ops/simd_util.h"
#endif

namespace ptllm::ops {
namespace {

using detail::pick;

// ---------- scalar references ----------
void dot_rows_scalar(const float* q, const float* k, int64_t len, int64_t hd, float scale, float* scores) {
  for (int64_t t = 0; t < len; ++t) scores[t] = dot_f32(q, k + t * hd, hd) * scale;
}
void weighted_sum_rows_scalar(const float* p, const float* v, int64_t len, int64_t hd, float* out) {
  for (int64_t t = 0; t < len; ++t)
    if (p[t] != 0.f) {
      const float a = p[t];
      const float* x = v + t * hd;
      for (int64_t i = 0; i < hd; ++i) out[i] += a * x[i];
    }
}

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

void dot_t_scalar(const float* const* q, int m, const float* kt, int64_t ld, int64_t len, int64_t hd, float scale,
                  float* const* scores) {
  for (int j = 0; j < m; ++j)
    for (int64_t t = 0; t < len; ++t) {
      float acc = q[j][0] * kt[t];
      for (int64_t d = 1; d < hd; ++d) acc = std::fma(q[j][d], kt[d * ld + t], acc);
      scores[j][t] = acc * scale;
    }
}

using DotRowsFn = void (*)(const float*, const float*, int64_t, float, float*);
using DotTransposedFn = void (*)(const float* const*, int, const float*, int64_t, int64_t, int64_t, float, float* const*);
using WeightedSumFn = void (*)(const float*, const float*, int64_t, float*);
using RotRowsFn = void (*)(const float*, const float*, int64_t, const float*, const float*, float, float*);
using WeightedSumMultiFn = void (*)(const float* const*, int, const float* const*, int64_t, float* const*);

#if PTLLM_X86
using detail::hsum16x16;
using detail::hsum8;

// ---------- AVX-512: dot_rows, weighted_sum_rows ----------
#pragma GCC push_options
#pragma GCC target("avx512f,fma,f16c")

// 16 keys' dot products with q (rows of hd = 16 * NC floats at k), reduced
// together: scores[0..16).
template <int NC>
inline void dot16_avx512(const __m512* qv, const float* k, __m512 sc, float* scores) {
  constexpr int64_t hd = 16 * NC;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    acc[j] = _mm512_mul_ps(_mm512_loadu_ps(k + j * hd), qv[0]);
#pragma GCC unroll 8
    for (int c = 1; c < NC; ++c) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(k + j * hd + 16 * c), qv[c], acc[j]);
  }
  _mm512_storeu_ps(scores, _mm512_mul_ps(hsum16x16(acc), sc));
}

// hd = 16 * NC: 16 keys per step. The last < 16 keys go through the same
// 16-key code on a zero-padded copy, so a key's score does not depend on where
// the run it is in starts or ends: a cache that splits its rows into runs
// (sinks, ring) scores them exactly as one run would.
template <int NC>
void dot_rows_avx512(const float* q, const float* k, int64_t len, float scale, float* scores) {
  constexpr int64_t hd = 16 * NC;
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  int64_t t = 0;
  for (; t + 16 <= len; t += 16) dot16_avx512<NC>(qv, k + t * hd, sc, scores + t);
  if (t < len) {
    alignas(64) float pad[16 * hd] = {};
    alignas(64) float out[16];
    std::memcpy(pad, k + t * hd, size_t((len - t) * hd) * sizeof(float));
    dot16_avx512<NC>(qv, pad, sc, out);
    std::memcpy(scores + t, out, size_t(len - t) * sizeof(float));
  }
}

// hd = 16 * NC <= 128: the output row stays in registers; keys are added in
// order, one FMA chain per 16 lanes, so the sum is the same whether the keys
// come in one run or several (sinks, then the ring), as in the reference.
template <int NC>
void weighted_sum_rows_avx512(const float* p, const float* v, int64_t len, float* out) {
  constexpr int64_t hd = 16 * NC;
  __m512 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_loadu_ps(out + 16 * c);
  for (int64_t t = 0; t < len; ++t) {
    // Masked keys have p == 0: skipped like the scalar reference (also keeps a
    // non-finite stale value out of the sum).
    if (p[t] == 0.f) continue;
    const __m512 pt = _mm512_set1_ps(p[t]);
    const float* vt = v + t * hd;
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vt + 16 * c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}
// M queries' weighted sums, hd = 16 * NC: per query the single-query kernel's
// operations in its order (a masked FMA is the skip of a p == 0 key), so the
// results are identical to M calls of it. kShared: over the same value rows
// v[0] (a prefill's queries of one head), loaded once per key for all M;
// otherwise each over its own v[j] (a decode step's heads). Either way the M
// queries' FMA chains interleave, where one query's chain alone waits on the
// FMA latency at every key.
template <int NC, int M, bool kShared>
void weighted_sum_multi_avx512(const float* const* p, const float* const* v, int64_t len, float* const* out) {
  constexpr int64_t hd = 16 * NC;
  __m512 acc[M][NC];
  for (int j = 0; j < M; ++j)
    for (int c = 0; c < NC; ++c) acc[j][c] = _mm512_loadu_ps(out[j] + 16 * c);
  // One key: masked FMAs where a query's p is 0 (skipped), else plain ones.
  const auto key = [&](int64_t t, bool all_nonzero) {
    __m512 vv[NC];
    if constexpr (kShared)
      for (int c = 0; c < NC; ++c) vv[c] = _mm512_loadu_ps(v[0] + t * hd + 16 * c);
#pragma GCC unroll 4
    for (int j = 0; j < M; ++j) {
      if constexpr (!kShared)
        for (int c = 0; c < NC; ++c) vv[c] = _mm512_loadu_ps(v[j] + t * hd + 16 * c);
      const float pj = p[j][t];
      const __m512 pt = _mm512_set1_ps(pj);
      if (all_nonzero) {
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) acc[j][c] = _mm512_fmadd_ps(pt, vv[c], acc[j][c]);
      } else {
        const __mmask16 k = pj != 0.f ? 0xFFFF : 0;
#pragma GCC unroll 4
        for (int c = 0; c < NC; ++c) acc[j][c] = _mm512_mask3_fmadd_ps(pt, vv[c], acc[j][c], k);
      }
    }
  };
  // Blocks of 16 keys where no query has a p of 0 (a prefill's causal rows,
  // away from their ends) skip the per-key mask: the same FMAs, fewer uops.
  const __m512 zero = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= len; t += 16) {
    bool all = true;
    for (int j = 0; j < M; ++j) all &= _mm512_cmp_ps_mask(_mm512_loadu_ps(p[j] + t), zero, _CMP_NEQ_UQ) == 0xFFFF;
    if (all)
      for (int i = 0; i < 16; ++i) key(t + i, true);
    else
      for (int i = 0; i < 16; ++i) key(t + i, false);
  }
  for (; t < len; ++t) key(t, false);
  for (int j = 0; j < M; ++j)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out[j] + 16 * c, acc[j][c]);
}
template <int NC, bool kShared>
void weighted_sum_multi_avx512_m(const float* const* p, int m, const float* const* v, int64_t len, float* const* out) {
  static_assert(kMultiQueries == 4, "the instantiations below");
  switch (m) {
    case 1: return weighted_sum_rows_avx512<NC>(p[0], v[0], len, out[0]);
    case 2: return weighted_sum_multi_avx512<NC, 2, kShared>(p, v, len, out);
    case 3: return weighted_sum_multi_avx512<NC, 3, kShared>(p, v, len, out);
    default: return weighted_sum_multi_avx512<NC, 4, kShared>(p, v, len, out);
  }
}

// M queries x 16 * NB keys per step, lanes over keys: per d one load per
// 16 keys and M FMAs each with the query's element broadcast (the
// reference's order per lane). Two blocks give 2M independent FMA chains
// (one block's M = 4 chains leave the FMA units waiting on the latency).
template <int M, int NB>
inline void dot_t_avx512_step(const float* const* q, const float* kt, int64_t ld, int64_t t, int64_t hd, __m512 sc,
                              float* const* scores) {
  __m512 acc[NB][M];
  for (int b = 0; b < NB; ++b) {
    const __m512 k0 = _mm512_loadu_ps(kt + t + 16 * b);
    for (int j = 0; j < M; ++j) acc[b][j] = _mm512_mul_ps(_mm512_set1_ps(q[j][0]), k0);
  }
  for (int64_t d = 1; d < hd; ++d) {
#pragma GCC unroll 2
    for (int b = 0; b < NB; ++b) {
      const __m512 kd = _mm512_loadu_ps(kt + d * ld + t + 16 * b);
#pragma GCC unroll 4
      for (int j = 0; j < M; ++j) acc[b][j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][d]), kd, acc[b][j]);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int j = 0; j < M; ++j) _mm512_storeu_ps(scores[j] + t + 16 * b, _mm512_mul_ps(acc[b][j], sc));
}
template <int M>
void dot_t_avx512_m(const float* const* q, const float* kt, int64_t ld, int64_t len, int64_t hd, float scale,
                    float* const* scores) {
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t t = 0;
  for (; t + 16 < len; t += 32) dot_t_avx512_step<M, 2>(q, kt, ld, t, hd, sc, scores);
  if (t < len) dot_t_avx512_step<M, 1>(q, kt, ld, t, hd, sc, scores);
}
void dot_t_avx512(const float* const* q, int m, const float* kt, int64_t ld, int64_t len, int64_t hd, float scale,
                  float* const* scores) {
  static_assert(kMultiQueries == 4, "the instantiations below");
  switch (m) {
    case 1: return dot_t_avx512_m<1>(q, kt, ld, len, hd, scale, scores);
    case 2: return dot_t_avx512_m<2>(q, kt, ld, len, hd, scale, scores);
    case 3: return dot_t_avx512_m<3>(q, kt, ld, len, hd, scale, scores);
    default: return dot_t_avx512_m<4>(q, kt, ld, len, hd, scale, scores);
  }
}

#pragma GCC pop_options

// ---------- AVX2: dot_rows, weighted_sum_rows ----------
// dot_rows_transposed: 8 keys per step (two per 16-key block).
template <int M>
__attribute__((target("avx2,fma"))) void dot_t_avx2_m(const float* const* q, const float* kt, int64_t ld, int64_t len,
                                                     int64_t hd, float scale, float* const* scores) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t t = 0; t < len; t += 8) {
    __m256 acc[M];
    const __m256 k0 = _mm256_loadu_ps(kt + t);
    for (int j = 0; j < M; ++j) acc[j] = _mm256_mul_ps(_mm256_set1_ps(q[j][0]), k0);
    for (int64_t d = 1; d < hd; ++d) {
      const __m256 kd = _mm256_loadu_ps(kt + d * ld + t);
      for (int j = 0; j < M; ++j) acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(q[j][d]), kd, acc[j]);
    }
    for (int j = 0; j < M; ++j) _mm256_storeu_ps(scores[j] + t, _mm256_mul_ps(acc[j], sc));
  }
}
void dot_t_avx2(const float* const* q, int m, const float* kt, int64_t ld, int64_t len, int64_t hd, float scale,
                float* const* scores) {
  switch (m) {
    case 1: return dot_t_avx2_m<1>(q, kt, ld, len, hd, scale, scores);
    case 2: return dot_t_avx2_m<2>(q, kt, ld, len, hd, scale, scores);
    case 3: return dot_t_avx2_m<3>(q, kt, ld, len, hd, scale, scores);
    default: return dot_t_avx2_m<4>(q, kt, ld, len, hd, scale, scores);
  }
}
// Each key's score is its own FMA chain over hd / 8 lanes and one horizontal
// sum (4 keys interleaved for throughput), so it does not depend on the run
// it is in, as with the AVX-512 kernel.
template <int NC>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 dot_one_avx2(const __m256* qv, const float* kt) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(kt), qv[0]);
  for (int c = 1; c < NC; ++c) acc = _mm256_fmadd_ps(_mm256_loadu_ps(kt + 8 * c), qv[c], acc);
  return acc;
}

template <int NC>
__attribute__((target("avx2,fma"))) void dot_rows_avx2(const float* q, const float* k, int64_t len, float scale,
                                                       float* scores) {
  constexpr int64_t hd = 8 * NC;
  __m256 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm256_loadu_ps(q + 8 * c);
  int64_t t = 0;
  for (; t + 4 <= len; t += 4) {
    const __m256 a0 = dot_one_avx2<NC>(qv, k + t * hd), a1 = dot_one_avx2<NC>(qv, k + (t + 1) * hd),
                 a2 = dot_one_avx2<NC>(qv, k + (t + 2) * hd), a3 = dot_one_avx2<NC>(qv, k + (t + 3) * hd);
    scores[t] = hsum8(a0) * scale;
    scores[t + 1] = hsum8(a1) * scale;
    scores[t + 2] = hsum8(a2) * scale;
    scores[t + 3] = hsum8(a3) * scale;
  }
  for (; t < len; ++t) scores[t] = hsum8(dot_one_avx2<NC>(qv, k + t * hd)) * scale;
}

// hd = 8 * NC: keys added in order, one FMA chain per 8 lanes (the AVX-512
// kernel's order), masked keys (p == 0) skipped as in the reference.
template <int NC>
__attribute__((target("avx2,fma"))) void weighted_sum_rows_avx2(const float* p, const float* v, int64_t len,
                                                                float* out) {
  constexpr int64_t hd = 8 * NC;
  __m256 acc[NC];
  for (int c = 0; c < NC; ++c) acc[c] = _mm256_loadu_ps(out + 8 * c);
  for (int64_t t = 0; t < len; ++t) {
    if (p[t] == 0.f) continue;
    const __m256 pt = _mm256_set1_ps(p[t]);
    const float* vt = v + t * hd;
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * c), acc[c]);
  }
  for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out + 8 * c, acc[c]);
}

DotRowsFn dot_rows_avx2_for(int64_t hd) {
  switch (hd) {
    case 16: return dot_rows_avx2<2>;
    case 32: return dot_rows_avx2<4>;
    case 64: return dot_rows_avx2<8>;
    case 128: return dot_rows_avx2<16>;
    default: return nullptr;
  }
}
WeightedSumFn weighted_sum_avx2_for(int64_t hd) {
  switch (hd) {
    case 16: return weighted_sum_rows_avx2<2>;
    case 32: return weighted_sum_rows_avx2<4>;
    case 64: return weighted_sum_rows_avx2<8>;
    case 128: return weighted_sum_rows_avx2<16>;
    default: return nullptr;
  }
}

// ---------- rotated rows: AVX-512 / AVX2 ----------
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

DotRowsFn dot_rows_avx512_for(int64_t hd) {
  switch (hd) {
    case 16: return dot_rows_avx512<1>;
    case 32: return dot_rows_avx512<2>;
    case 64: return dot_rows_avx512<4>;
    case 128: return dot_rows_avx512<8>;
    default: return nullptr;
  }
}
WeightedSumFn weighted_sum_avx512_for(int64_t hd) {
  switch (hd) {
    case 16: return weighted_sum_rows_avx512<1>;
    case 32: return weighted_sum_rows_avx512<2>;
    case 64: return weighted_sum_rows_avx512<4>;
    case 128: return weighted_sum_rows_avx512<8>;
    default: return nullptr;
  }
}
// 4 queries x NC accumulators stay in registers up to head_dim 64; wider
// heads take one query at a time.
WeightedSumMultiFn weighted_sum_multi_avx512_for(int64_t hd, bool shared) {
  switch (hd) {
    case 16: return shared ? weighted_sum_multi_avx512_m<1, true> : weighted_sum_multi_avx512_m<1, false>;
    case 32: return shared ? weighted_sum_multi_avx512_m<2, true> : weighted_sum_multi_avx512_m<2, false>;
    case 64: return shared ? weighted_sum_multi_avx512_m<4, true> : weighted_sum_multi_avx512_m<4, false>;
    default: return nullptr;
  }
}
RotRowsFn rot_rows_avx512_for(int64_t half) {
  switch (half) {
    case 16: return rot_rows_avx512<1>;
    case 32: return rot_rows_avx512<2>;
    case 64: return rot_rows_avx512<4>;
    default: return nullptr;
  }
}
RotRowsFn rot_rows_avx2_for(int64_t half) {
  switch (half) {
    case 8: return rot_rows_avx2<1>;
    case 16: return rot_rows_avx2<2>;
    case 32: return rot_rows_avx2<4>;
    case 64: return rot_rows_avx2<8>;
    default: return nullptr;
  }
}
DotTransposedFn dot_t_avx512_fn() { return dot_t_avx512; }
DotTransposedFn dot_t_avx2_fn() { return dot_t_avx2; }
#else
DotTransposedFn dot_t_avx512_fn() { return nullptr; }
DotTransposedFn dot_t_avx2_fn() { return nullptr; }
DotRowsFn dot_rows_avx2_for(int64_t) { return nullptr; }
WeightedSumFn weighted_sum_avx2_for(int64_t) { return nullptr; }
DotRowsFn dot_rows_avx512_for(int64_t) { return nullptr; }
WeightedSumFn weighted_sum_avx512_for(int64_t) { return nullptr; }
WeightedSumMultiFn weighted_sum_multi_avx512_for(int64_t, bool) { return nullptr; }
RotRowsFn rot_rows_avx512_for(int64_t) { return nullptr; }
RotRowsFn rot_rows_avx2_for(int64_t) { return nullptr; }
#endif  // PTLLM_X86

}  // namespace

// A null pick() below means "no SIMD variant for this size": the reference runs.
void dot_rows(const float* q, const float* k, int64_t len, int64_t hd, float scale, float* scores) {
  if (const DotRowsFn f = pick<DotRowsFn>(nullptr, dot_rows_avx2_for(hd), dot_rows_avx512_for(hd))) return f(q, k, len, scale, scores);
  dot_rows_scalar(q, k, len, hd, scale, scores);
}

void weighted_sum_rows(const float* p, const float* v, int64_t len, int64_t hd, float* out) {
  if (const WeightedSumFn f = pick<WeightedSumFn>(nullptr, weighted_sum_avx2_for(hd), weighted_sum_avx512_for(hd)))
    return f(p, v, len, out);
  weighted_sum_rows_scalar(p, v, len, hd, out);
}

void weighted_sum_rows_multi(const float* const* p, int m, const float* v, int64_t len, int64_t hd, float* const* out) {
  if (m > kMultiQueries) fail("weighted_sum_rows_multi: {} queries, at most {}", m, kMultiQueries);
  if (m > 1)
    if (const WeightedSumMultiFn f = pick<WeightedSumMultiFn>(nullptr, nullptr, weighted_sum_multi_avx512_for(hd, true))) {
      const float* vs[kMultiQueries] = {v, v, v, v};
      return f(p, m, vs, len, out);
    }
  for (int j = 0; j < m; ++j) weighted_sum_rows(p[j], v, len, hd, out[j]);
}

void weighted_sum_rows_heads(const float* const* p, const float* const* v, int m, int64_t len, int64_t hd,
                             float* const* out) {
  if (m > kMultiQueries) fail("weighted_sum_rows_heads: {} queries, at most {}", m, kMultiQueries);
  if (m > 1)
    if (const WeightedSumMultiFn f = pick<WeightedSumMultiFn>(nullptr, nullptr, weighted_sum_multi_avx512_for(hd, false)))
      return f(p, m, v, len, out);
  for (int j = 0; j < m; ++j) weighted_sum_rows(p[j], v[j], len, hd, out[j]);
}

void dot_rows_transposed(const float* const* q, int m, const float* kt, int64_t ld, int64_t len, int64_t hd,
                         float scale, float* const* scores) {
  if (m < 1 || m > kMultiQueries) fail("dot_rows_transposed: {} queries, expected 1..{}", m, kMultiQueries);
  if (hd < 1 || ld < (len + 15) / 16 * 16)
    fail("dot_rows_transposed: head_dim {} and key stride {} for {} keys (expected >= 1 and >= {})", hd, ld, len,
         (len + 15) / 16 * 16);
  if (len <= 0) return;
  if (const DotTransposedFn f = pick<DotTransposedFn>(nullptr, dot_t_avx2_fn(), dot_t_avx512_fn()))
    return f(q, m, kt, ld, len, hd, scale, scores);
  dot_t_scalar(q, m, kt, ld, len, hd, scale, scores);
}

void dot_rows_rotated(const float* q, const float* k, int64_t n, int64_t hd, const float* kcos, const float* ksin,
                      float scale, float* scores) {
  if (n <= 0) return;
  const int64_t half = hd / 2;
  if (const RotRowsFn f = pick<RotRowsFn>(nullptr, rot_rows_avx2_for(half), rot_rows_avx512_for(half)))
    return f(q, k, n, kcos, ksin, scale, scores);
  rot_rows_scalar(q, k, n, hd, kcos, ksin, scale, scores);
}

}  // namespace ptllm::ops
