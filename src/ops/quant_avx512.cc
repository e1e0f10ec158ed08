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
// acc + dpbusd(u, the dword at s4 in every lane), the broadcast taken from
// memory by dpbusd itself ({1to16}). GCC 12 does not fold _mm512_set1_epi32
// of a load into dpbusd, and its separate vpbroadcastd per dpbusd was a third
// of the 16-row kernels' instructions.
inline __m512i dpbusd_bcast(__m512i acc, __m512i u, const void* s4) {
#if defined(__GNUC__)
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*static_cast<const int32_t*>(s4)));
  return acc;
#else
  int32_t v;
  std::memcpy(&v, s4, 4);
  return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(v));
#endif
}
inline __m256i dot_u8s8_w(__m256i acc, __m256i u, __m256i s, __m256i w16) {
  return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), w16);
}

#include "ops/quant_simd.inc"

// ---------- Q8_0: register tiles of 4 rows x 4 tokens on 512-bit vectors ----------
// (Q4_0 had this tile until session 12; it now takes the 16-rows-in-lanes
// tile below, which decodes Q8_0 22% slower: 34-byte blocks of 16 rows side
// by side.)
// A vector holds two 32-element blocks: lanes 0-7 the dpbusd lane sums of
// the even block i, lanes 8-15 those of the odd block i + 1. A (row, token)
// pair keeps one fp32 accumulator vector, so its low half is the 256-bit
// kernels' even-block accumulator and its high half the odd one, and the sum
// ends as theirs does (low + high, then hsum). For Q8_0 every operation on a
// token's lanes is the 256-bit kernel's, so Q8_0 results are unchanged (the
// last block of an odd count adds 0 * 0 to the high half, which can at most
// turn a -0 into +0).
//
// dpbusd multiplies u8 by s8 and adds to a seed. The activation is made
// unsigned once per token, x + 128 (xor 0x80; the 256-bit kernels instead
// take |w| and give x w's sign, two operations per row and token, and AVX-512
// has no vpsignb), and each row's seed is -128 * (its lane's 4 weights' sum),
// so dpbusd returns x . w exactly. The token side (codes, scales spread over
// the lanes) is laid out once per call (tile_acts512_pair), so per (row,
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

// TileActs for Q8_0: one row of A32 blocks -> TilePairs (codes made unsigned,
// scales spread over the lanes).
void tile_acts512_pair(const std::byte* a32, int64_t nb, std::byte* dst) {
  const auto* x = reinterpret_cast<const A32*>(a32);
  auto* o = reinterpret_cast<TilePair*>(dst);
  for (int64_t i = 0; i < nb; i += 2, ++o) {
    const bool one = i + 1 == nb;
    const __m512i xv = _mm512_maskz_mov_epi32(
        one ? 0x00FF : 0xFFFF, _mm512_xor_si512(pair_codes(x[i].qs, one ? nullptr : x[i + 1].qs),
                                                _mm512_set1_epi8(char(0x80))));
    const __m256 lo = _mm256_set1_ps(x[i].d);
    const __m512 xd = one ? _mm512_zextps256_ps512(lo)
                          : _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                                                _mm256_castps_pd(_mm256_set1_ps(x[i + 1].d)), 1));
    _mm512_storeu_si512(o->qs, xv);
    _mm512_storeu_ps(o->d, xd);
  }
}

// Q8_0 row r's blocks i and i + 1 (or block i alone: kOne, the last of an
// odd count) times NT tokens, into c0..c3 (token t into c_t). The token codes
// are unsigned (x + 128); the seed -128 * sum(w) makes the dpbusd sum x . w.
template <int NT, bool kOne>
__attribute__((always_inline)) inline void tile512_row(const BlockQ8_0* b, const TilePair* const* x, int64_t i,
                                                        __m512& c0, __m512& c1, __m512& c2, __m512& c3) {
  const int64_t p = i / 2;
  const __m512i wv = pair_codes(b[i].qs, kOne ? nullptr : b[i + 1].qs);
  const __m512i seed = _mm512_sub_epi32(_mm512_setzero_si512(),
                                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), wv));
  const __m512 wd = pair_scales_f16<int(sizeof(BlockQ8_0))>(&b[i], kOne);
  const auto mac = [&](const TilePair& xp, __m512& c) {
    const __m512i dot = _mm512_dpbusd_epi32(seed, _mm512_loadu_si512(xp.qs), wv);
    // One block: the high half adds 0 * 0 (its codes and scales are 0).
    c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wd, _mm512_loadu_ps(xp.d)), c);
  };
  mac(x[0][p], c0);
  if constexpr (NT > 1) mac(x[1][p], c1);
  if constexpr (NT > 2) mac(x[2][p], c2);
  if constexpr (NT > 3) mac(x[3][p], c3);
}

template <int NR, int NT>
void tile512_t(const std::byte* w, size_t ws, const std::byte* xt, size_t xs, int64_t nb, float* out) {
  static_assert(NR >= 1 && NR <= 4 && NT >= 1 && NT <= 4);
  using Blk = BlockQ8_0;
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
    tile512_row<NT, kOne>(b[0], x, i, a00, a01, a02, a03);
    if constexpr (NR > 1) tile512_row<NT, kOne>(b[1], x, i, a10, a11, a12, a13);
    if constexpr (NR > 2) tile512_row<NT, kOne>(b[2], x, i, a20, a21, a22, a23);
    if constexpr (NR > 3) tile512_row<NT, kOne>(b[3], x, i, a30, a31, a32, a33);
  };
  const int64_t pairs_end = nb & ~int64_t(1);
  for (int64_t i = 0; i < pairs_end; i += 2) {
    // One token per pass is bound by the weight stream (detail::prefetch_stream).
    if constexpr (NT == 1)
      for (int r = 0; r < NR; ++r) detail::prefetch_stream(b[r] + i);
    step.template operator()<false>(i);
  }
  if (nb & 1) step.template operator()<true>(pairs_end);
  const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) out[r * kMaxNT + t] = hsum512(acc[r][t]);
}

void tile512_q8(const std::byte* w, size_t ws, int nr, const std::byte* xt, size_t xs, int64_t nb, int nt,
                float* out) {
  static_assert(kTileRows == 4 && kMaxNT == 4, "with_1to4 covers the counts");
  with_1to4(nr, [&](auto NR) { with_1to4(nt, [&](auto NT) { tile512_t<NR(), NT()>(w, ws, xt, xs, nb, out); }); });
}

// ---------- Q4_0: 16 rows in the 16 lanes ----------
// A 32-bit lane is one weight row: W_k (k = 0..7) holds 4 consecutive codes
// (elements 4k..4k+3 of a block) of each of 16 rows, and the token's same 4
// codes are broadcast to every lane (dpbusd's embedded {1to16} operand). So
// 8 dpbusd give each row's exact integer block sum in its own lane, and the
// block's scales are one vector (16 rows' d) times one broadcast (the
// token's): per (16 rows, token, block) 8 dpbusd + convert, multiply, FMA,
// and no horizontal sum at the end. The rows are transposed into the lanes
// once per block and shared by up to kMaxNT tokens (4 x 128-bit loads of 4
// rows each, an 8-shuffle 4 x 4 dword transpose).
//
// dpbusd multiplies u8 (the lane operand) by s8 (the broadcast token code):
// Q4_0's nibbles q are unsigned and the token's seed -8 * sum(x) gives
// (q - 8) . x exactly. The token side (codes, scale, seed per block;
// TileBlock) is laid out once per call.
//
// Per (row, token) the arithmetic is one fixed sequence, acc = fma(float(
// block sum), d_w * d_x, acc) over the blocks in order, in the row's lane:
// nothing depends on the other lanes' rows (a tail tile clamps its missing
// rows to row 0 and drops them) or on the other tokens, so results do not
// depend on n_tokens, the row offset or the tile (batch invariance). One
// token takes the same kernel (16 rows per pass; the next 16 rows are
// prefetched while these are read, below).

// TileActs for Q4_0: one row of A32 blocks -> TileBlocks (codes, scale, seed).
void tile_acts512_block(const std::byte* a32, int64_t nb, std::byte* dst) {
  const auto* x = reinterpret_cast<const A32*>(a32);
  auto* o = reinterpret_cast<TileBlock*>(dst);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = load32(x[i].qs);
    // sum of the 32 codes: dpbusd of ones (u8) with the codes (s8).
    const int sum = hsum_i32x8(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o[i].qs), q);
    o[i].d = x[i].d;
    o[i].seed = -8 * sum;
  }
}

// Dwords k of 16 rows (4 x 128 bits each in a..d as [r0 r4 r8 r12], [r1 r5
// r9 r13], [r2 ..], [r3 ..]) -> w[k] with lane r = dword k of row r.
inline void transpose16x4(__m512i a, __m512i b, __m512i c, __m512i d, __m512i* w) {
  const __m512i t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
  const __m512i t2 = _mm512_unpacklo_epi32(c, d), t3 = _mm512_unpackhi_epi32(c, d);
  w[0] = _mm512_unpacklo_epi64(t0, t2);
  w[1] = _mm512_unpackhi_epi64(t0, t2);
  w[2] = _mm512_unpacklo_epi64(t1, t3);
  w[3] = _mm512_unpackhi_epi64(t1, t3);
}
// 16 bytes at p[r] + off for rows j, j + 4, j + 8, j + 12.
inline __m512i rows4(const std::byte* const* p, int j, size_t off) {
  const auto ld = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[r] + off)); };
  const __m512i v = _mm512_castsi128_si512(ld(j));
  return _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(v, ld(j + 4), 1), ld(j + 8), 2), ld(j + 12), 3);
}

// Where the 16-rows-in-lanes tiles' results go (lane r of acc[t] is row r,
// token t): a TileDot's out[r * kMaxNT + t] for r < nr, or a GroupDot's
// y[t * ystride + r] + bias[r], one vector per token.
struct LanesOut {
  float* out;
  int nr;
};
struct GroupOut {
  const float* bias;
  float* y;
  int64_t ystride;
};
template <int NT>
inline void store_tile(const __m512* acc, const LanesOut& o) {
  alignas(64) float v[NT][16];
  for (int t = 0; t < NT; ++t) _mm512_store_ps(v[t], acc[t]);
  for (int r = 0; r < o.nr; ++r)
    for (int t = 0; t < NT; ++t) o.out[r * kMaxNT + t] = v[t][r];
}
template <int NT>
inline void store_tile(const __m512* acc, const GroupOut& o) {
  const __m512 b = o.bias ? _mm512_loadu_ps(o.bias) : _mm512_setzero_ps();
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(o.y + t * o.ystride, _mm512_add_ps(acc[t], b));
}

// One block of a 16-row group with NT tokens (Q4_0_R16 and Q8_0_R16): wv[k]
// holds the 16 rows' unsigned codes 4k .. 4k + 3 (Q4_0's nibbles q, Q8_0's
// w + 128), so dpbusd with the token's 4 signed codes broadcast from memory
// gives each row's sum of u x in its own lane, and the token's seed (-8 *
// sum(x), times 2^kSeedShift: -128 * sum(x) for Q8_0) makes it the exact
// integer block sum. acc[t] += float(sum) * (wd * d_t), in this order per
// lane. The tokens' chains are interleaved in the program (k outer), so
// adjacent dpbusd are independent; one or two tokens are too few chains and
// sum each block in two half chains instead (codes 0-15, 16-31; integer sums,
// so the same bits), halving the latency each block waits on.
template <int NT, int kSeedShift>
inline void r16_block(const __m512i* wv, __m512 wd, const TileBlock* const* x, int64_t i, __m512* acc) {
  constexpr int kChains = NT <= 2 ? 2 : 1;
  __m512i sc[NT][kChains];
  for (int t = 0; t < NT; ++t) {
    sc[t][0] = _mm512_slli_epi32(_mm512_set1_epi32(x[t][i].seed), kSeedShift);
    if constexpr (kChains == 2) sc[t][1] = _mm512_setzero_si512();
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) sc[t][k * kChains / 8] = dpbusd_bcast(sc[t][k * kChains / 8], wv[k], x[t][i].qs + 4 * k);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    const __m512i s = kChains == 2 ? _mm512_add_epi32(sc[t][0], sc[t][kChains - 1]) : sc[t][0];
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd, _mm512_set1_ps(x[t][i].d)), acc[t]);
  }
}

// kPacked: w is one group of Q4_0_R16 (core/dtype.h), whose record i holds
// exactly what the GGUF-layout path gathers and transposes for block i (the
// 16 scales, then wk[0..3]), so both paths compute every sum with the same
// instructions from the same integers: bit-identical results.
template <int NT, bool kPacked, class Out>
void tile16_t(const std::byte* w, size_t ws, int nr, const std::byte* xt, size_t xs, int64_t nb, const Out& out) {
  constexpr size_t B = sizeof(BlockQ4_0);
  const TileBlock* x[NT];
  for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const TileBlock*>(xt + size_t(t) * xs);
  // The file layout's 16 row pointers and their byte offsets (for the scale
  // gather); a packed group needs neither, and at 256-wide rows (8 blocks
  // a call) the set-up is not small next to the loop.
  const std::byte* row[16] = {};
  __m512i roff = _mm512_setzero_si512();
  bool gather_ok = true;
  if constexpr (!kPacked) {
    for (int r = 0; r < 16; ++r) row[r] = w + size_t(r < nr ? r : 0) * ws;
    alignas(64) int32_t o[16];
    for (int r = 0; r < 16; ++r) o[r] = int32_t(row[r] - row[0]);
    roff = _mm512_load_si512(o);
    gather_ok = size_t(nr) * ws < (size_t(1) << 31);  // 32-bit gather offsets
  }
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const char* pf = reinterpret_cast<const char*>(w + 16 * ws);
  if (nb <= 0) {  // a 0-column weight: every sum is 0
    store_tile<NT>(acc, out);
    return;
  }
  const size_t pf_step = kPacked ? 0 : (16 * ws / size_t(nb) + 63) & ~size_t(63);
  for (int64_t i = 0; i < nb; ++i) {
    const size_t bo = size_t(i) * B;
    if constexpr (kPacked) {
      // One stream: the hardware prefetchers follow it; software prefetches
      // of every line of the record (prefetch_stream) keep it ahead across
      // the 4 KiB page crossings (one line per 288-byte record, before
      // session 18, left 3 of 4.5 lines to the hardware).
      if constexpr (NT == 1)
        for (size_t l = 0; l < 16 * B; l += 64) detail::prefetch_stream(reinterpret_cast<const char*>(w + 16 * bo) + l);
    } else if constexpr (NT == 1)
      // One token is bound by the weight stream. The 16 rows are read side by
      // side, 18 or 34 bytes each per step, too many streams for the hardware
      // prefetchers, and a row is often shorter than prefetch_stream's
      // distances; the next 16 rows (the next row block of the same thread
      // under a static schedule) are prefetched instead, 1/nb of them per
      // step. Prefetching past the matrix's end faults nothing.
      for (size_t l = size_t(i) * pf_step; l < size_t(i + 1) * pf_step; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    __m512i wv[8];
    const std::byte* rec = w + 16 * bo;  // kPacked: record i
    {
      __m512i wk[4];
      if constexpr (kPacked) {
        for (int k = 0; k < 4; ++k) wk[k] = _mm512_loadu_si512(rec + 32 + 64 * k);
      } else {
        transpose16x4(rows4(row, 0, bo + 2), rows4(row, 1, bo + 2), rows4(row, 2, bo + 2), rows4(row, 3, bo + 2), wk);
      }
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      for (int k = 0; k < 4; ++k) {
        wv[k] = _mm512_and_si512(wk[k], low4);                            // elements 4k..4k+3
        wv[k + 4] = _mm512_and_si512(_mm512_srli_epi32(wk[k], 4), low4);  // 16 + 4k..
      }
    }
    // 16 rows' fp16 scales: the record's first 32 bytes, or a gather of the
    // dwords at each row's block start.
    __m256i dh;
    if constexpr (kPacked) {
      dh = load32(rec);
    } else if (gather_ok) {
      dh = _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(roff, reinterpret_cast<const int*>(row[0] + bo), 1));
    } else {
      alignas(32) uint16_t s[16];
      for (int r = 0; r < 16; ++r) std::memcpy(&s[r], row[r] + bo, 2);
      dh = load32(s);
    }
    const __m512 wd = _mm512_cvtph_ps(dh);
    // Q4_0: codes 0..15 are elements 0..15 (low nibbles), wv[k + 4] 16..31.
    r16_block<NT, 0>(wv, wd, x, i, acc);
  }
  store_tile<NT>(acc, out);
}

void tile16_q4(const std::byte* w, size_t ws, int nr, const std::byte* xt, size_t xs, int64_t nb, int nt,
               float* out) {
  static_assert(kMaxNT == 4, "with_1to4 covers the counts");
  with_1to4(nt, [&](auto NT) { tile16_t<NT(), false>(w, ws, nr, xt, xs, nb, LanesOut{out, nr}); });
}
void tile16_q4_r16(const std::byte* w, const std::byte* xt, size_t xs, int64_t nb, int nt, const float* bias, float* y,
                   int64_t ystride) {
  with_1to8(nt, [&](auto NT) { tile16_t<NT(), true>(w, 0, 16, xt, xs, nb, GroupOut{bias, y, ystride}); });
}

// ---------- Q8_0_R16: 16 rows in the 16 lanes ----------
// w is one group of Q8_0_R16 (core/dtype.h): record i (544 bytes) is the 16
// rows' fp16 scales, then 8 vectors, vector k holding codes 4k .. 4k + 3 of
// row r in lane r. The kernel makes the weights unsigned (w + 128, one xor
// per vector, shared by the tokens) and takes the token side as Q4_0's
// TileBlocks (signed codes, so dpbusd reads them as its {1to16} memory
// operand), whose seed -8 * sum(x) shifted by 4 is the -128 * sum(x) that
// makes sum((w + 128) x) the exact w . x: r16_block, as Q4_0_R16. Until
// session 19 the token codes were the unsigned side (Q8_0's TilePairs) and
// the seed the weights', 8 more dpbusd a block and a register broadcast per
// dpbusd; the integers and the fp32 steps are the same, so are the bits.
// Per (16 rows, token, block): 8 dpbusd, convert, multiply, FMA, in a fixed
// order per lane (batch invariance); the 4 x 4 tile FMAs partial lane sums
// instead, so the results differ from its in the last fp32 bits.
template <int NT>
void tile16_q8_t(const std::byte* w, const std::byte* xt, size_t xs, int64_t nb, const GroupOut& out) {
  constexpr size_t kRec = 16 * sizeof(BlockQ8_0);
  const TileBlock* x[NT];
  for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const TileBlock*>(xt + size_t(t) * xs);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i k80 = _mm512_set1_epi8(char(0x80));
  for (int64_t i = 0; i < nb; ++i) {
    const std::byte* rec = w + size_t(i) * kRec;
    if constexpr (NT == 1)  // one token is bound by the weight stream
      for (size_t l = 0; l < kRec; l += 64) detail::prefetch_stream(reinterpret_cast<const char*>(rec) + l);
    const __m512 wd = _mm512_cvtph_ps(load32(rec));
    __m512i wv[8];
    for (int k = 0; k < 8; ++k) wv[k] = _mm512_xor_si512(_mm512_loadu_si512(rec + 32 + 64 * k), k80);
    r16_block<NT, 4>(wv, wd, x, i, acc);
  }
  store_tile<NT>(acc, out);
}

void tile16_q8_r16(const std::byte* w, const std::byte* xt, size_t xs, int64_t nb, int nt, const float* bias, float* y,
                   int64_t ystride) {
  with_1to8(nt, [&](auto NT) { tile16_q8_t<NT()>(w, xt, xs, nb, GroupOut{bias, y, ystride}); });
}

// ---------- Q4_K_R16: 16 rows in the 16 lanes ----------
// w is one group of Q4_K_R16 (core/dtype.h); record i (super-block column i,
// 2,304 bytes) is the 16 rows' d (32 bytes), dmin (32), their 12 scale bytes
// as 3 dword vectors, and their 128 code bytes as 32 dword vectors: vector j
// = 8c + jj (chunk c) holds in lane r the codes qs[32c + 4jj .. + 3] of row r,
// whose low nibbles are elements 64c + 4jj .. + 3 (sub-block 2c) and high
// ones 64c + 32 + 4jj .. (2c + 1) (BlockQ4_K). The token's same 4 codes are
// broadcast (the A256 rows as they are), so dpbusd gives each row's exact
// sub-block sum (q . xq)_s in its own lane, 8 dpbusd a sub-block.
// The 6-bit scales and mins of 16 rows decode in the lanes (k4_scales: bytes
// 0-3 give sc 0-3, 4-7 m 0-3, 8-11 the low 4 bits of sc/m 4-7, whose top 2
// bits are the top 2 of bytes 0-3 / 4-7). Per (16 rows, token, super-block):
// S = sum_s sc_s * (q . xq)_s (vpmulld, exact: |S| < 2^25), M = sum_s m_s *
// bsum32_s (4 vpdpwssd of the mins as i16 pairs with the token's pair sums,
// exact), then x = dx * (d * S - dmin * M): the exact integers of the row
// kernels, the fp32 steps in this fixed order per lane, so a (row, token)
// result depends on nothing else in the call (batch invariance). It differs
// from the 4-row tile's in the last fp32 bits (that tile sums S's partial
// lanes at the end of the row).
template <int NT>
void tile16k_t(const std::byte* w, const std::byte* xt, size_t xs, int64_t nb, const GroupOut& out) {
  constexpr size_t kRec = 16 * sizeof(BlockQ4_K);
  const A256* x[NT];
  for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const A256*>(xt + size_t(t) * xs);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const __m512i k3f = _mm512_set1_epi8(0x3F), k0f = _mm512_set1_epi8(0x0F), k03 = _mm512_set1_epi8(0x03),
                kff = _mm512_set1_epi32(0xFF), k00ff = _mm512_set1_epi32(0x00FF00FF);
  for (int64_t i = 0; i < nb; ++i) {
    const std::byte* rec = w + size_t(i) * kRec;
    if constexpr (NT == 1)  // one token is bound by the weight stream
      for (size_t l = 0; l < kRec; l += 64) detail::prefetch_stream(reinterpret_cast<const char*>(rec) + l);
    const __m512 d = _mm512_cvtph_ps(load32(rec)), dmin = _mm512_cvtph_ps(load32(rec + 32));
    const __m512i sa = _mm512_loadu_si512(rec + 64), sb = _mm512_loadu_si512(rec + 128),
                  sc = _mm512_loadu_si512(rec + 192);
    // Per lane, bytes: sc03 = sc 0..3, sc47 = sc 4..7, mn03 / mn47 the mins.
    const __m512i sc03 = _mm512_and_si512(sa, k3f), mn03 = _mm512_and_si512(sb, k3f);
    const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(sc, k0f),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sa, 6), k03), 4));
    const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sc, 4), k0f),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sb, 6), k03), 4));
    // The mins as i16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7).
    const __m512i m02 = _mm512_and_si512(mn03, k00ff), m13 = _mm512_and_si512(_mm512_srli_epi32(mn03, 8), k00ff);
    const __m512i m46 = _mm512_and_si512(mn47, k00ff), m57 = _mm512_and_si512(_mm512_srli_epi32(mn47, 8), k00ff);
    __m512i S[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int c = 0; c < 4; ++c) {
      __m512i lo_sum[4], hi_sum[4];
      for (int t = 0; t < NT; ++t) lo_sum[t] = hi_sum[t] = _mm512_setzero_si512();
      for (int jj = 0; jj < 8; ++jj) {
        const __m512i v = _mm512_loadu_si512(rec + 256 + 64 * (8 * c + jj));
        const __m512i lo = _mm512_and_si512(v, k0f), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), k0f);
        for (int t = 0; t < NT; ++t) {
          lo_sum[t] = dpbusd_bcast(lo_sum[t], lo, x[t][i].qs + 64 * c + 4 * jj);
          hi_sum[t] = dpbusd_bcast(hi_sum[t], hi, x[t][i].qs + 64 * c + 32 + 4 * jj);
        }
      }
      // sc_{2c} and sc_{2c+1}: bytes 2c % 4 and 2c % 4 + 1 of sc03 (c < 2) or sc47.
      const __m512i scv = c < 2 ? sc03 : sc47;
      const int sh = 16 * (c % 2);
      const __m512i s_lo = _mm512_and_si512(_mm512_srli_epi32(scv, sh), kff);
      const __m512i s_hi = _mm512_and_si512(_mm512_srli_epi32(scv, sh + 8), kff);
      for (int t = 0; t < NT; ++t)
        S[t] = _mm512_add_epi32(S[t], _mm512_add_epi32(_mm512_mullo_epi32(lo_sum[t], s_lo),
                                                       _mm512_mullo_epi32(hi_sum[t], s_hi)));
    }
    for (int t = 0; t < NT; ++t) {
      const int16_t* bs = x[t][i].bsums;
      // bsum32_s = bsums[2s] + bsums[2s + 1]; pairs (s, s + 2) as one dword.
      const auto pair = [&](int s0, int s1) {
        const int b0 = bs[2 * s0] + bs[2 * s0 + 1], b1 = bs[2 * s1] + bs[2 * s1 + 1];
        return _mm512_set1_epi32(int32_t(uint32_t(uint16_t(b0)) | uint32_t(uint16_t(b1)) << 16));
      };
      __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m02, pair(0, 2));
      M = _mm512_dpwssd_epi32(M, m13, pair(1, 3));
      M = _mm512_dpwssd_epi32(M, m46, pair(4, 6));
      M = _mm512_dpwssd_epi32(M, m57, pair(5, 7));
      const __m512 v = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(M), _mm512_mul_ps(d, _mm512_cvtepi32_ps(S[t])));
      acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(x[t][i].d), acc[t]);
    }
  }
  store_tile<NT>(acc, out);
}

void tile16_q4k_r16(const std::byte* w, const std::byte* xt, size_t xs, int64_t nb, int nt, const float* bias, float* y,
                    int64_t ystride) {
  with_1to4(nt, [&](auto NT) { tile16k_t<NT()>(w, xt, xs, nb, GroupOut{bias, y, ystride}); });
}

// TileActs: each type in the layout of its tile.
void tile_acts512(DType t, const std::byte* a32, int64_t nb, std::byte* dst) {
  if (t == DType::Q8_0) tile_acts512_pair(a32, nb, dst);
  else tile_acts512_block(a32, nb, dst);
}

// ---------- Q4_K / Q5_K / Q6_K register tiles on 512-bit vectors ----------
// The token side is the A256 rows as they are (no re-layout). Chunk c of a
// super-block is 64 elements: the low nibbles of qs[32c..32c+31] (sub-block
// 2c) then the high ones (2c + 1), the same order as the token's codes
// qs[64c..64c+63], so one 512-bit weight vector meets one 512-bit token load.
// maddubs (u8 levels x s8 codes, pair sums <= 2 * 31 * 127, no saturation)
// then dpwssd by [sc_2c x16 | sc_2c+1 x16] gives 16 exact i32 lane sums of
// sum_s sc[s] * (q . xq)_s. The mins term sum_s m[s] * bsum32(s) is
// sum_k m[k/2] * bsums[k] over the token's 16 per-16 sums: one madd, 8 lanes.
// Per (row, token, super-block): x = dx * (d * S - dmin * M), S in 16 lanes,
// M in lanes 0-7 (cvt, mul, masked FMA, FMA). Every (row, token) sum runs
// the same instructions whatever else shares the tile (batch invariance).
// The results differ from the 256-bit kernel's in the last fp32 bits (the
// float terms are grouped differently).

// Q6_K: half h of a super-block is [ql0 | ql1] = ql[64h .. 64h + 63] and
// qh[32h .. 32h + 31]; its levels e (0..63) for elements 128h + 0..63 are the
// low nibbles with qh bits 0-1 / 2-3, for 128h + 64..127 the high nibbles
// with bits 4-5 / 6-7 (BlockQ6_K), each 64 in the token's code order. maddubs
// (pair sums <= 2 * 63 * 128) then dpwssd by the signed scale of each
// 16-element sub-block (8 i16 lanes each). The -32 offset stays in the
// integers: S - 32 * sum_k sc[k] * bsums[k] (one madd, 8 lanes), exact; then
// x = d * dx * S' (cvt, mul, FMA).
template <int NT>
__attribute__((always_inline)) inline void tileq6k512_row(const std::byte* row, const A256* const* x, int64_t i,
                                                           __m512& c0, __m512& c1, __m512& c2, __m512& c3) {
  const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[i];
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  const __m512i sc512 = _mm512_castsi256_si512(sc16);
  const __m512i low4 = _mm512_set1_epi8(0x0F), three = _mm512_set1_epi8(3);
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i l = _mm512_loadu_si512(b.ql + 64 * h);
    const __m256i qh = load32(b.qh + 32 * h);
    const __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    const __m512i e[2] = {
        _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_slli_epi16(_mm512_and_si512(hh, three), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                        _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hh, 4), three), 4))};
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      // Sub-blocks 8h + 4k .. 8h + 4k + 3, 8 i16 lanes each.
      const short s = short(8 * h + 4 * k);
      const __m512i scv = _mm512_permutexvar_epi16(
          _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_setr_m128i(_mm_set1_epi16(s), _mm_set1_epi16(short(s + 1)))),
                             _mm256_setr_m128i(_mm_set1_epi16(short(s + 2)), _mm_set1_epi16(short(s + 3))), 1),
          sc512);
      const auto mac = [&](const A256* xt, __m512i& acc) {
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(e[k], _mm512_loadu_si512(xt[i].qs + 128 * h + 64 * k)), scv);
      };
      mac(x[0], s0);
      if constexpr (NT > 1) mac(x[1], s1);
      if constexpr (NT > 2) mac(x[2], s2);
      if constexpr (NT > 3) mac(x[3], s3);
    }
  }
  const __m512 d = _mm512_set1_ps(h2f(b.d));
  const auto fold = [&](const A256* xt, __m512i s, __m512& acc) {
    const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(xt[i].bsums)), 5);
    s = _mm512_sub_epi32(s, _mm512_zextsi256_si512(corr));
    acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), d), _mm512_set1_ps(xt[i].d), acc);
  };
  fold(x[0], s0, c0);
  if constexpr (NT > 1) fold(x[1], s1, c1);
  if constexpr (NT > 2) fold(x[2], s2, c2);
  if constexpr (NT > 3) fold(x[3], s3, c3);
}

template <DType D>
using KBlock = std::conditional_t<D == DType::Q4_K, BlockQ4_K, std::conditional_t<D == DType::Q5_K, BlockQ5_K, BlockQ6_K>>;

template <bool kFive, int NT>
__attribute__((always_inline)) inline void tileq45k512_row(const std::byte* row, const A256* const* x, int64_t i,
                                                            __m512& c0, __m512& c1, __m512& c2, __m512& c3) {
  using B = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const B& b = reinterpret_cast<const B*>(row)[i];
  __m128i sc8, m8;
  k4_scales_simd(b.scales, &sc8, &m8);
  // [sc0..sc7] as i16 in the low 128 bits; [m0 m0 m1 m1 .. m7 m7] as i16.
  const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sc8));
  const __m256i mexp = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
  const __m512 d = _mm512_set1_ps(h2f(b.d)), ndmin = _mm512_set1_ps(-h2f(b.dmin));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i hb;
  if constexpr (kFive) {
    const __m256i h = load32(b.qh);
    hb = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 1), 1);
  }
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m256i q = load32(b.qs + 32 * c);
    __m512i wv = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1), low4);
    if constexpr (kFive)
      // bit 2c of qh[l] is element 64c + l's fifth bit, bit 2c + 1 element
      // 64c + 32 + l's: hb holds [qh | qh >> 1], so bit 2c of each byte.
      wv = _mm512_or_si512(
          wv, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hb, 2 * c), _mm512_set1_epi8(1)), 4));
    const __m512i scv = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi16(short(2 * c)), _mm256_set1_epi16(short(2 * c + 1)), 1), sc16);
    const auto mac = [&](const A256* xt, __m512i& s) {
      s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(wv, _mm512_loadu_si512(xt[i].qs + 64 * c)), scv);
    };
    mac(x[0], s0);
    if constexpr (NT > 1) mac(x[1], s1);
    if constexpr (NT > 2) mac(x[2], s2);
    if constexpr (NT > 3) mac(x[3], s3);
  }
  const auto fold = [&](const A256* xt, const __m512i& s, __m512& acc) {
    const __m256i mm = _mm256_madd_epi16(mexp, load32(xt[i].bsums));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(s), d);
    v = _mm512_mask3_fmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(mm)), ndmin, v, 0x00FF);
    acc = _mm512_fmadd_ps(v, _mm512_set1_ps(xt[i].d), acc);
  };
  fold(x[0], s0, c0);
  if constexpr (NT > 1) fold(x[1], s1, c1);
  if constexpr (NT > 2) fold(x[2], s2, c2);
  if constexpr (NT > 3) fold(x[3], s3, c3);
}

template <DType D, int NT>
__attribute__((always_inline)) inline void tilek512_row(const std::byte* row, const A256* const* x, int64_t i,
                                                         __m512& c0, __m512& c1, __m512& c2, __m512& c3) {
  if constexpr (D == DType::Q6_K)
    tileq6k512_row<NT>(row, x, i, c0, c1, c2, c3);
  else
    tileq45k512_row<D == DType::Q5_K, NT>(row, x, i, c0, c1, c2, c3);
}

template <DType D, int NR, int NT>
void tilek512_t(const std::byte* w, size_t ws, const std::byte* xt, size_t xs, int64_t nb, float* out) {
  static_assert(NR >= 1 && NR <= 4 && NT >= 1 && NT <= 4);
  using B = KBlock<D>;
  const std::byte* r[NR];
  const A256* x[NT];
  for (int k = 0; k < NR; ++k) r[k] = w + size_t(k) * ws;
  for (int t = 0; t < NT; ++t) x[t] = reinterpret_cast<const A256*>(xt + size_t(t) * xs);
  // Named accumulators: see tile512_t.
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00,
         a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  for (int64_t i = 0; i < nb; ++i) {
    // A super-block spans 3-4 cache lines; every pass prefetches (the K
    // types' prefill gained from it too, quant_simd.inc).
    for (int k = 0; k < NR; ++k)
      for (int l = 0; l < int(sizeof(B)); l += 64) detail::prefetch_stream(r[k] + size_t(i) * sizeof(B) + l);
    tilek512_row<D, NT>(r[0], x, i, a00, a01, a02, a03);
    if constexpr (NR > 1) tilek512_row<D, NT>(r[1], x, i, a10, a11, a12, a13);
    if constexpr (NR > 2) tilek512_row<D, NT>(r[2], x, i, a20, a21, a22, a23);
    if constexpr (NR > 3) tilek512_row<D, NT>(r[3], x, i, a30, a31, a32, a33);
  }
  const __m512 acc[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
  for (int k = 0; k < NR; ++k)
    for (int t = 0; t < NT; ++t) out[k * kMaxNT + t] = hsum512(acc[k][t]);
}

template <DType D>
void tilek512(const std::byte* w, size_t ws, int nr, const std::byte* xt, size_t xs, int64_t nb, int nt, float* out) {
  static_assert(kTileRows == 4 && kMaxNT == 4, "with_1to4 covers the counts");
  with_1to4(nr, [&](auto NR) { with_1to4(nt, [&](auto NT) { tilek512_t<D, NR(), NT()>(w, ws, xt, xs, nb, out); }); });
}

constexpr Kernels kTable512 = [] {
  Kernels k = kTable;
  // Q8_0: 4 rows x 4 tokens, one token row by row (16 rows in the lanes
  // measured 10-17% faster prefill but 22% slower decode on the 1B shape:
  // 34-byte blocks of 16 rows side by side). Q4_0: 16 rows in the lanes for
  // any token count (1B shape: prefill +30-45%, decode +9-11%, with the
  // weights in huge pages; docs/BENCHMARKS.md "Session 12").
  k.tile[kernel_index(DType::Q8_0)] = tile512_q8;
  k.tile_rows[kernel_index(DType::Q8_0)] = kTileRows;
  k.tile_rows1[kernel_index(DType::Q8_0)] = 1;
  k.tile[kernel_index(DType::Q4_0)] = tile16_q4;
  k.tile_r16[kernel_index(DType::Q4_0)] = tile16_q4_r16;
  k.tile_r16[kernel_index(DType::Q8_0)] = tile16_q8_r16;
  k.tile_r16[kernel_index(DType::Q4_K)] = tile16_q4k_r16;
  // Q8_0's seed (8 dpbusd of ones a block) is shared by the call's tokens:
  // 8 of them gave the 1B shape's Q8_0 prefill ~10% (docs/BENCHMARKS.md,
  // session 17). Q4_0's nibble split and scale load, shared the same way,
  // measured no better at 8 in session 17, and +10-13% in session 18 once
  // SwiGLU's blocks no longer missed (scripts/ab_bench.sh, 6 rounds). Q4_K
  // stays at 4: its per-token sums already take 16 vector registers.
  k.group_nt[kernel_index(DType::Q8_0)] = k.group_nt[kernel_index(DType::Q4_0)] = 8;
  k.group_nt[kernel_index(DType::Q4_K)] = 4;
  k.tile_rows[kernel_index(DType::Q4_0)] = k.tile_rows1[kernel_index(DType::Q4_0)] = 16;
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    k.tile_rows[kernel_index(t)] = 4;
    k.tile_rows1[kernel_index(t)] = 1;
  }
  k.tile[kernel_index(DType::Q4_K)] = tilek512<DType::Q4_K>;
  k.tile[kernel_index(DType::Q5_K)] = tilek512<DType::Q5_K>;
  k.tile[kernel_index(DType::Q6_K)] = tilek512<DType::Q6_K>;
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
