// Fused KIVI attention kernels (kivi_kernels.h): q·k and p·v straight from
// the packed int8/int4/int3/int2 codes and their fp16 parameters. Scalar
// references, AVX2 and AVX-512 variants, chosen by pick() (dispatch.h).
#include "ops/kivi_kernels.h"

#include <cstring>
#include <type_traits>

#include "ops/dispatch.h"
#include "ops/kivi_fold.h"
#include "ops/neon_kernels.h"
#include "ops/rope.h"
#if PTLLM_X86
#include "ops/simd_util.h"
#endif

namespace ptllm::ops {
namespace {

using detail::pick;

using detail::KeyCoef;

// Position in a ring of code rows (cap rows, oldest at `start`).
struct RingPos {
  int64_t cap = 0, start = 0;
  int64_t phys(int64_t j) const {
    const int64_t p = start + j;
    return p >= cap ? p - cap : p;
  }
};

// Quantised tokens t0 .. t0+n-1 of one head: codes at rows ring.phys(t) of
// `base`; cos/sin rows and scores start at the first of them.
struct TokenRun {
  const uint8_t* base;
  size_t row;
  RingPos ring;
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

// K per token: scores[j] = scale * (s_t * q.u_t + z_t * sum q).
void key_tok_run_scalar(const TokenRun& run, kivi::QuantRange r, int64_t hd, const kivi::AffineParams* params,
                        const float* q, float qsum, float scale, float* scores) {
  uint8_t tmp[kMaxHeadDim];
  for (int64_t j = 0; j < run.n; ++j) {
    const int64_t row = run.ring.phys(run.t0 + j);
    const kivi::WideParams w = kivi::widen(params[row]);
    const uint8_t* u = kivi::unpack_row(run.base + size_t(row) * run.row, hd, r, tmp);
    float acc = 0.f;
    for (int64_t i = 0; i < hd; ++i) acc += q[i] * float(u[i]);
    scores[j] = scale * (w.scale * acc + w.zero * qsum);
  }
}
#if PTLLM_X86
using detail::hsum8;

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
  } else if constexpr (BITS == 3) {
    // Bits 3i..3i+2 of the row: 16 codes are the 48 bits at byte 6b, two
    // 24-bit words of eight codes. Each word is broadcast to eight 32-bit
    // lanes, shifted by 0, 3, ..., 21 and masked, then the 16 lanes are
    // narrowed to bytes (packus keeps 128-bit lanes: permute restores order).
    uint64_t w = 0;
    std::memcpy(&w, row + 6 * b, 6);
    const __m256i sh = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21), m = _mm256_set1_epi32(7);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(w & 0xffffff)), sh), m);
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int((w >> 24) & 0xffffff)), sh), m);
    // packus_epi32: [lo0-3 hi0-3 | lo4-7 hi4-7] as 16-bit; 0xD8 -> [lo0-7 | hi0-7].
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    return _mm_packus_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
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

template <int BITS, int NB>
__attribute__((target("avx512f,avx2,fma,f16c"))) void key_tok_run_avx512(const TokenRun& run,
                                                                    const kivi::AffineParams* params, const float* q,
                                                                    float qsum, float scale, float* scores) {
  __m512 qv[NB];
  for (int b = 0; b < NB; ++b) qv[b] = _mm512_loadu_ps(q + 16 * b);
  const int64_t cap = run.ring.cap;
  int64_t pr = run.ring.phys(run.t0);
  for (int64_t j = 0; j < run.n; ++j, pr = pr + 1 == cap ? 0 : pr + 1) {
    const uint8_t* row = run.base + size_t(pr) * run.row;
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < NB; ++b)
      acc = _mm512_fmadd_ps(qv[b], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes16<BITS>(row, b))), acc);
    const float ws = _cvtsh_ss(params[pr].scale.bits()), wz = _cvtsh_ss(params[pr].zero.bits());
    scores[j] = scale * (ws * _mm512_reduce_add_ps(acc) + wz * qsum);
  }
}

// ---- AVX2: the same 16-code blocks as two 8-lane halves ----

__attribute__((target("avx2,fma"), always_inline)) inline void widen16(__m128i x, __m256& lo, __m256& hi) {
  lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)));
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
template <int BITS, int NB>
__attribute__((target("avx2,fma,f16c"))) void key_tok_run_avx2(const TokenRun& run, const kivi::AffineParams* params,
                                                         const float* q, float qsum, float scale, float* scores) {
  const int64_t cap = run.ring.cap;
  int64_t pr = run.ring.phys(run.t0);
  for (int64_t j = 0; j < run.n; ++j, pr = pr + 1 == cap ? 0 : pr + 1) {
    const uint8_t* row = run.base + size_t(pr) * run.row;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < NB; ++b) {
      __m256 u[2];
      widen16(codes16<BITS>(row, b), u[0], u[1]);
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * b), u[0], acc);
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 16 * b + 8), u[1], acc);
    }
    const float ws = _cvtsh_ss(params[pr].scale.bits()), wz = _cvtsh_ss(params[pr].zero.bits());
    scores[j] = scale * (ws * hsum8(acc) + wz * qsum);
  }
}

#endif  // PTLLM_X86
// ---- dispatch: the variant for (bits, head_dim) at the current level ----

using KeyRunFn = void (*)(const TokenRun&, const KeyCoef&, const float*, const float*, float*);
using ValueRunFn = void (*)(const TokenRun&, const kivi::AffineParams*, const float*, float*, float&);
using KeyTokFn = void (*)(const TokenRun&, const kivi::AffineParams*, const float*, float, float, float*);
// The SIMD variants are templates over the code width BITS and the number W of
// 16-lane blocks in a row (a row of 16·W floats). by_bits / by_width turn the
// run-time (bits, size) into those parameters once, for every kernel family.
template <int N>
using Const = std::integral_constant<int, N>;
template <class Get>
auto by_bits(int bits, Get get) {
  switch (bits) {
    case 8: return get(Const<8>{});
    case 4: return get(Const<4>{});
    case 3: return get(Const<3>{});
    default: return get(Const<2>{});
  }
}
// Null (no variant) unless size = 16·W for W in 1, 2, 4, 8 (and 16 when MAX_W is 16).
template <int MAX_W, class Get>
auto by_width(int64_t size, Get get) -> decltype(get(Const<1>{})) {
  switch (size) {
    case 16: return get(Const<1>{});
    case 32: return get(Const<2>{});
    case 64: return get(Const<4>{});
    case 128: return get(Const<8>{});
    case 256:
      if constexpr (MAX_W >= 16) return get(Const<16>{});
      [[fallthrough]];
    default: return nullptr;
  }
}

#if PTLLM_X86
// Each kernel family: its pointer type, its AVX2 / AVX-512 template (as a
// variable template over BITS and W) and its widest row in 16-lane blocks.
// Keys per channel work on half rows (the RoPE halves), so theirs stops at 8.
#define PTLLM_KIVI_FAMILY(Name, FnType, max_w, kernel)  \
  struct Name {                                          \
    using Fn = FnType;                                   \
    static constexpr int kMaxW = max_w;                  \
    template <int B, int W>                              \
    static constexpr Fn avx2 = kernel##_avx2<B, W>;      \
    template <int B, int W>                              \
    static constexpr Fn avx512 = kernel##_avx512<B, W>;  \
  };
PTLLM_KIVI_FAMILY(KeyFamily, KeyRunFn, 8, key_run)
PTLLM_KIVI_FAMILY(ValueFamily, ValueRunFn, 16, value_run)
PTLLM_KIVI_FAMILY(KeyTokFamily, KeyTokFn, 16, key_tok_run)
#undef PTLLM_KIVI_FAMILY
// The variant of `F` for (bits, size) at the current level; null: the scalar reference.
template <class F>
typename F::Fn pick_variant(int bits, int64_t size) {
  using Fn = typename F::Fn;
  return by_bits(bits, [&](auto b) {
    using B = decltype(b);
    return pick<Fn>(nullptr,
                    by_width<F::kMaxW>(size, [](auto w) -> Fn { return F::template avx2<B::value, decltype(w)::value>; }),
                    by_width<F::kMaxW>(size, [](auto w) -> Fn { return F::template avx512<B::value, decltype(w)::value>; }));
  });
}
KeyRunFn pick_key(kivi::QuantRange r, int64_t half) { return pick_variant<KeyFamily>(r.bits, half); }
ValueRunFn pick_value(kivi::QuantRange r, int64_t hd) { return pick_variant<ValueFamily>(r.bits, hd); }
KeyTokFn pick_key_tok(kivi::QuantRange r, int64_t hd) { return pick_variant<KeyTokFamily>(r.bits, hd); }
#else
KeyRunFn pick_key(kivi::QuantRange, int64_t) { return nullptr; }
ValueRunFn pick_value(kivi::QuantRange, int64_t) { return nullptr; }
KeyTokFn pick_key_tok(kivi::QuantRange, int64_t) { return nullptr; }
#endif

}  // namespace

void kivi_key_scores(const KiviCodes& k, int64_t t0, int64_t n, const kivi::AffineParams* params, const float* q,
                     float scale, const float* kcos, const float* ksin, float* scores) {
  if (n <= 0) return;
#if PTLLM_NEON
  if (const auto f = pick<neon::KiviKeyFn>(nullptr, nullptr, nullptr, neon::kivi_key_for(k.range.bits, k.head_dim)))
    return f(k, t0, n, params, q, scale, kcos, ksin, scores);
#endif
  const int64_t hd = k.head_dim, half = hd / 2;
  const KeyRunFn simd = pick_key(k.range, half);
  KeyCoef coef;
  detail::fold_key_group(q, params, half, scale, coef);
  const TokenRun run{k.base, k.row_bytes, {k.cap, k.start}, t0, n};
  if (simd)
    simd(run, coef, kcos, ksin, scores);
  else
    key_run_scalar(run, k.range, hd, coef, kcos, ksin, scores);
}

void kivi_key_scores_tokens(const KiviCodes& k, int64_t t0, int64_t n, const kivi::AffineParams* params,
                            const float* q, float scale, float* scores) {
  if (n <= 0) return;
  const int64_t hd = k.head_dim;
  float qsum = 0.f;
  for (int64_t i = 0; i < hd; ++i) qsum += q[i];
  const TokenRun run{k.base, k.row_bytes, {k.cap, k.start}, t0, n};
  if (const KeyTokFn simd = pick_key_tok(k.range, hd))
    simd(run, params, q, qsum, scale, scores);
  else
    key_tok_run_scalar(run, k.range, hd, params, q, qsum, scale, scores);
}

void kivi_value_sum(const KiviCodes& v, int64_t t0, int64_t n, const kivi::AffineParams* params, const float* p,
                    float* out) {
  if (n <= 0) return;
#if PTLLM_NEON
  if (const auto f = pick<neon::KiviValueFn>(nullptr, nullptr, nullptr, neon::kivi_value_for(v.range.bits, v.head_dim)))
    return f(v, t0, n, params, p, out);
#endif
  const int64_t hd = v.head_dim;
  alignas(64) float acc[kMaxHeadDim] = {};
  float bias = 0.f;
  const TokenRun run{v.base, v.row_bytes, {v.cap, v.start}, t0, n};
  if (const ValueRunFn simd = pick_value(v.range, hd))
    simd(run, params, p, acc, bias);
  else
    value_run_scalar(run, v.range, hd, params, p, acc, bias);
  for (int64_t i = 0; i < hd; ++i) out[i] += acc[i] + bias;
}

}  // namespace ptllm::ops
