// Small x86 helpers shared by the SIMD kernels of src/ops (internal); every
// x86 kernel file includes this instead of <immintrin.h>.
#pragma once
#include <immintrin.h>

// GCC 12's own AVX-512 intrinsics headers trip these on _mm512_undefined_*()
// once inlined; the warnings are about the headers, not the kernels. (They
// hold for the rest of the including file, which is the point.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ptllm::ops::detail {

// Software prefetch of a weight stream: a decode kernel calls it once per
// 64-byte line of weights as it reaches the line. One token's pass has ~1
// multiply per weight byte and waits on the stream; the hardware prefetchers
// alone left two cores at ~45% of the DRAM read bandwidth on the 1B-shape
// Q4_0/Q4_K models (session 9, when 2 KiB ahead into L1 gained Q4_K 16-24%,
// Q4_0 11-44% and Q8_0 5-24% in most pairs). Two requests: into L1
// kPrefetchNear ahead, and into L2 kPrefetchFar ahead, so that more lines are
// in flight than L1's miss buffers allow and the stream keeps going across
// 4 KiB pages, where the hardware prefetchers stop. Old (L1 only, 1.1-4.6 KiB
// by kernel) and new binary alternated, 1B shape, `bench -p 0 -n 32`
// (docs/BENCHMARKS.md "Session 21"): bf16 12.7-14.0 -> 15.1-22.1 tokens/s,
// Q8_0 25.0-28.0 -> 27.9-30.1, Q4_K and Q4_0 within the rounds' spread.
// Multi-token passes are compute-bound: only the K types (whose prefill gained
// 4-5%) prefetch there. Prefetch changes no result; prefetching past an
// allocation's end faults nothing.
constexpr long kPrefetchNear = 2048, kPrefetchFar = 8192;
inline __attribute__((always_inline)) void prefetch_stream(const void* line) {
  const char* p = static_cast<const char*>(line);
  _mm_prefetch(p + kPrefetchNear, _MM_HINT_T0);
  _mm_prefetch(p + kPrefetchFar, _MM_HINT_T1);
}

// Sum of the 8 lanes.
__attribute__((target("avx2,fma"), always_inline)) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane j of the result = the sum of the 16 lanes of a[j], for 16 vectors at
// once (a transpose-and-add tree: 45 shuffles and adds instead of 16 separate
// reductions). Per vector the additions are, with e = a[j] and
// P_L = (e[4L] + e[4L+2]) + (e[4L+1] + e[4L+3]) for each 128-bit lane L:
// (P_0 + P_1) + (P_2 + P_3). reduce16_tree computes that order for one vector,
// so a kernel that reduces 16 outputs at once and one that reduces them one by
// one give the same bits (batch invariance of the decode products).
__attribute__((target("avx512f"), always_inline)) inline __m512 hsum16x16(const __m512* a) {
  __m512 w[8];
  for (int j = 0; j < 8; ++j)
    w[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
  __m512 x[4];
  for (int j = 0; j < 4; ++j) {
    const __m512d l = _mm512_castps_pd(w[2 * j]), r = _mm512_castps_pd(w[2 * j + 1]);
    x[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(l, r)), _mm512_castpd_ps(_mm512_unpackhi_pd(l, r)));
  }
  // x[g]: 128-bit lane L holds vectors 4g..4g+3's P_L.
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The sum of the 16 lanes of v in hsum16x16's order (above); float addition
// is commutative, so each step adds a lane to its partner either way round.
__attribute__((target("avx512f"), always_inline)) inline float reduce16_tree(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));        // e0 + e2, e1 + e3
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));        // P_L
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));  // P_0 + P_1, P_2 + P_3
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_cvtss_f32(v);
}

}  // namespace ptllm::ops::detail
