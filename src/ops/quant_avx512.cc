// AVX-512 VNNI quantised dot kernels (256-bit vectors with AVX512VL): dpbusd
// does u8 x s8 -> i32 accumulate in one instruction, dpwssd the scaled i16
// pair sums of the K types. Kernel bodies: quant_simd.inc. CPUs with AVX-512F
// but without VNNI/VL/BW get the AVX2 kernels at this level.
#include <cstring>
#include <type_traits>

#include "ops/quant_impl.h"
#include "ops/simd_util.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

namespace ptllm::ops::q {
namespace {

inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i dot_u8s8_w(__m256i acc, __m256i u, __m256i s, __m256i w16) {
  return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), w16);
}

#include "ops/quant_simd.inc"

// ---------- Q8_0 / Q4_0 register tiles on 512-bit vectors ----------
// A vector holds two 32-element blocks: lanes 0-7 the dpbusd lane sums of
// the even block i, lanes 8-15 those of the odd block i + 1. A (row, token)
// pair keeps one fp32 accumulator vector, so its low half is the 256-bit
// kernels' even-block accumulator and its high half the odd one, and the sum
// ends as theirs does (low + high, then hsum). For Q8_0 every operation on a
// token's lanes is the 256-bit kernel's, so Q8_0 results are unchanged (the
// last block of an odd count adds 0 * 0 to the high half, which can at most
// turn a -0 into +0). Q4_0's offset moved into the integer sum (below), so
// its results differ from the 256-bit kernel's in the last fp32 bits.
//
// dpbusd multiplies u8 by s8 and adds to a seed. Q8_0: the activation is
// made unsigned once per token, x + 128 (xor 0x80; the 256-bit kernels
// instead take |w| and give x w's sign, two operations per row and token, and
// AVX-512 has no vpsignb), and each row's seed is -128 * (its lane's 4
// weights' sum), so dpbusd returns x . w exactly. Q4_0: the nibbles q are
// the unsigned side and each token's seed is -8 * (its lane's 4 codes' sum),
// which gives (q - 8) . x exactly. The token side (codes, scales spread over
// the lanes, seeds) is laid out once per call (tile_acts512), so per (row,
// token, pair of blocks) the tile does dpbusd, convert, scale product, FMA;
// each row's unpacking is shared by up to kMaxNT tokens.

inline float hsum512(__m512 v) {
  const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE));  // lanes 8-15
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}
// Two blocks' 32 bytes at p and q -> [p | q]; one block (q null) -> [p | 0].
inline __m512i pair_codes(const void* p, const void* q) {
  return q ? _mm512_inserti64x4(_mm512_castsi256_si512(load32(p)), load32(q), 1) : _mm512_zextsi256_si512(load32(p));
}
// The fp16 scale of block i (and i + 1 unless `one`) -> [d_i x8 | d_{i+1} x8]
// (0 in the high half for one block). Blocks of B bytes, the scale their
// first field; the masked load reads only the two scales.
template <int B>
inline __m512 pair_scales_f16(const void* blocks, bool one) {
  static_assert(B % 2 == 0 && B / 2 < 32, "the second scale must be a 16-bit word within 64 bytes");
  constexpr short kNext = B / 2;
  const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                       kNext, kNext, kNext, kNext, kNext, kNext, kNext, kNext, 0, 0, 0, 0, 0, 0, 0, 0);
  const __mmask32 m = one ? 0x1u : (1u << kNext) | 1u;
  const __m512i h = _mm512_maskz_loadu_epi16(m, blocks);
  return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, h)));
}

// TileActs: one row of A32 blocks -> TilePairs.
void tile_acts512(DType t, const std::byte* a32, int64_t nb, std::byte* dst) {
  const auto* x = reinterpret_cast<const A32*>(a32);
  auto* o = reinterpret_cast<TilePair*>(dst);
  for (int64_t i = 0; i < nb; i += 2, ++o) {
    const bool one = i + 1 == nb;
    __m512i xv = pair_codes(x[i].qs, one ? nullptr : x[i + 1].qs);
    __m512i seed = _mm512_setzero_si512();
    if (t == DType::Q8_0) {
      xv = _mm512_maskz_mov_epi32(one ? 0x00FF : 0xFFFF, _mm512_xor_si512(xv, _mm512_set1_epi8(char(0x80))));
    } else {
      seed = _mm512_sub_epi32(seed, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), xv));
    }
    const __m256 lo = _mm256_set1_ps(x[i].d);
    const __m512 xd = one ? _mm512_zextps256_ps512(lo)
                          : _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                                                _mm256_castps_pd(_mm256_set1_ps(x[i + 1].d)), 1));
    _mm512_storeu_si512(o->qs, xv);
    _mm512_storeu_ps(o->d, xd);
    _mm512_storeu_si512(o->seed, seed);
  }
}

// Row r's blocks i and i + 1 (or block i alone: kOne, the last of an odd
// count) times NT tokens, into c0..c3 (token t into c_t).
template <DType D, int NT, bool kOne, typename Blk>
__attribute__((always_inline)) inline void tile512_row(const Blk* b, const TilePair* const* x, int64_t i, __m512& c0,
                                                        __m512& c1, __m512& c2, __m512& c3) {
  const int64_t p = i / 2;
  __m512i wv, seed;
  if constexpr (D == DType::Q8_0) {
    wv = pair_codes(b[i].qs, kOne ? nullptr : b[i + 1].qs);
    seed = _mm512_sub_epi32(_mm512_setzero_si512(),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), wv));
  } else {
    // 16 bytes of nibbles per block -> [lo_i, hi_i, lo_{i+1}, hi_{i+1}], 16 levels each.
    const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i].qs));
    const __m128i qc = kOne ? _mm_setzero_si128() : _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[i + 1].qs));
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qc, 1);
    wv = _mm512_and_si512(_mm512_permutex2var_epi64(_mm512_castsi256_si512(q), _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11),
                                                    _mm512_castsi256_si512(_mm256_srli_epi16(q, 4))),
                          _mm512_set1_epi8(0x0F));
    seed = _mm512_setzero_si512();  // unused: Q4_0 takes the token's seed
  }
  const __m512 wd = pair_scales_f16<int(sizeof(Blk))>(&b[i], kOne);
  const auto mac = [&](const TilePair& xp, __m512& c) {
    const __m512i xv = _mm512_loadu_si512(xp.qs);
    const __m512i dot = D == DType::Q8_0 ? _mm512_dpbusd_epi32(seed, xv, wv)
                                         : _mm512_dpbusd_epi32(_mm512_loadu_si512(xp.seed), wv, xv);
    // One block: the high half adds 0 * 0 (its codes and scales are 0).
    c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wd, _mm512_loadu_ps(xp.d)), c);
  };
  mac(x[0][p], c0);
  if constexpr (NT > 1) mac(x[1][p], c1);
  if constexpr (NT > 2) mac(x[2][p], c2);
  if constexpr (NT > 3) mac(x[3][p], c3);
}

template <DType D, int NR, int NT>
void tile512_t(const std::byte* w, size_t ws, const std::byte* xt, size_t xs, int64_t nb, float* out) {
  static_assert(D == DType::Q8_0 || D == DType::Q4_0);
  static_assert(NR >= 1 && NR <= 4 && NT >= 1 && NT <= 4);
  using Blk = std::conditional_t<D == DType::Q8_0, BlockQ8_0, BlockQ4_0>;
  const Blk* b[NR];
  const TilePair* x[NT];
  for (int r = 0; r < NR; ++r) b[r] = reinterpret_cast<const Blk*>(w + size_t(r) * ws);
  for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const TilePair*>(xt + size_t(t) * xs);
  // Named accumulators, not an array: GCC kept an array of 16 in memory and
  // stored every one back each step (the loads of the weights and tokens
  // may alias it), one 64-byte store per FMA.
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00,
         a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  const auto step = [&]<bool kOne>(int64_t i) {
    tile512_row<D, NT, kOne>(b[0], x, i, a00, a01, a02, a03);
    if constexpr (NR > 1) tile512_row<D, NT, kOne>(b[1], x, i, a10, a11, a12, a13);
    if constexpr (NR > 2) tile512_row<D, NT, kOne>(b[2], x, i, a20, a21, a22, a23);
    if constexpr (NR > 3) tile512_row<D, NT, kOne>(b[3], x, i, a30, a31, a32, a33);
  };
  const int64_t pairs_end = nb & ~int64_t(1);
  for (int64_t i = 0; i < pairs_end; i += 2) {
    // One token per pass is bound by the weight stream (prefetch_ahead).
    if constexpr (NT == 1)
      for (int r = 0; r < NR; ++r) prefetch_ahead(b[r] + i);
    step.template operator()<false>(i);
  }
  if (nb & 1) step.template operator()<true>(pairs_end);
  const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) out[r * kMaxNT + t] = hsum512(acc[r][t]);
}

template <DType D, int NR>
void tile512_nr(const std::byte* w, size_t ws, const std::byte* xt, size_t xs, int64_t nb, int nt, float* out) {
  switch (nt) {
    case 1: return tile512_t<D, NR, 1>(w, ws, xt, xs, nb, out);
    case 2: return tile512_t<D, NR, 2>(w, ws, xt, xs, nb, out);
    case 3: return tile512_t<D, NR, 3>(w, ws, xt, xs, nb, out);
    default: return tile512_t<D, NR, 4>(w, ws, xt, xs, nb, out);
  }
}
template <DType D>
void tile512(const std::byte* w, size_t ws, int nr, const std::byte* xt, size_t xs, int64_t nb, int nt, float* out) {
  static_assert(kTileRows == 4 && kMaxNT == 4, "the instantiations below");
  switch (nr) {
    case 1: return tile512_nr<D, 1>(w, ws, xt, xs, nb, nt, out);
    case 2: return tile512_nr<D, 2>(w, ws, xt, xs, nb, nt, out);
    case 3: return tile512_nr<D, 3>(w, ws, xt, xs, nb, nt, out);
    default: return tile512_nr<D, 4>(w, ws, xt, xs, nb, nt, out);
  }
}

constexpr Kernels kTable512 = [] {
  Kernels k = kTable;
  k.tile[kernel_index(DType::Q8_0)] = tile512<DType::Q8_0>;
  k.tile[kernel_index(DType::Q4_0)] = tile512<DType::Q4_0>;
  k.tile_acts = tile_acts512;
  return k;
}();

}  // namespace
}  // namespace ptllm::ops::q

#pragma GCC pop_options

namespace ptllm::ops::q {

const Kernels& kernels_avx512() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
  }();
  return vnni ? kTable512 : kernels_avx2();
}

}  // namespace ptllm::ops::q
