// Internal to the quantised kernels: ggml's block layouts, the int8
// activation blocks, and the per-ISA kernel tables (quant_*.cc).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace ptllm::ops::q {

// ---------- weight blocks (ggml-common.h layouts; f16 fields as raw bits) ----------
// Packed: rows of 34-, 18-, 22-byte blocks put blocks at any address.
// Q8_0: x[i] = d * qs[i].
struct __attribute__((packed)) BlockQ8_0 { uint16_t d; int8_t qs[32]; };
// Q4_0: x[j] = d * ((qs[j] & 15) - 8), x[j + 16] = d * ((qs[j] >> 4) - 8), j < 16.
struct __attribute__((packed)) BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
// Q4_1: the same nibbles, x = d * q + m.
struct __attribute__((packed)) BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
// Q5_0: q = nibble | (bit i of the little-endian u32 qh) << 4, x = d * (q - 16).
struct __attribute__((packed)) BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
// Q5_1: as Q5_0 with x = d * q + m.
struct __attribute__((packed)) BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
// Q4_K: 256 = 4 chunks of 64; chunk c: qs[32c + l] low nibble is element 64c + l
// (sub-block 2c), high nibble element 64c + 32 + l (sub-block 2c + 1);
// x = d * sc[s] * q - dmin * m[s], sc/m six bits packed in `scales` (k4_scales).
struct __attribute__((packed)) BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
// Q5_K: Q4_K plus a fifth bit: element 64c + l has bit 2c of qh[l], element
// 64c + 32 + l bit 2c + 1.
struct __attribute__((packed)) BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
// Q6_K: two halves of 128; half h, l < 32, ql = ql + 64h, qh = qh + 32h:
//   e[l]      = ql[l] & 15      | (qh[l] >> 0 & 3) << 4
//   e[l + 32] = ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4
//   e[l + 64] = ql[l] >> 4      | (qh[l] >> 4 & 3) << 4
//   e[l + 96] = ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4
// x = d * scales[element / 16] * (e - 32).
struct __attribute__((packed)) BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };

static_assert(sizeof(BlockQ8_0) == block_bytes(DType::Q8_0));
static_assert(sizeof(BlockQ4_0) == block_bytes(DType::Q4_0));
static_assert(sizeof(BlockQ4_1) == block_bytes(DType::Q4_1));
static_assert(sizeof(BlockQ5_0) == block_bytes(DType::Q5_0));
static_assert(sizeof(BlockQ5_1) == block_bytes(DType::Q5_1));
static_assert(sizeof(BlockQ4_K) == block_bytes(DType::Q4_K));
static_assert(sizeof(BlockQ5_K) == block_bytes(DType::Q5_K));
static_assert(sizeof(BlockQ6_K) == block_bytes(DType::Q6_K));

// Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and mins: sub-blocks 0..3 are the
// low 6 bits of bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 take their
// low 4 bits from byte 8..11 (scale: low nibble, min: high nibble) and their
// top 2 bits from the top 2 bits of bytes 0..3 (scale) and 4..7 (min).
inline void k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = uint8_t((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    m[j] = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Round to nearest, ties to even, for finite |v| < 2^22 (larger values are
// clamped first): adding 1.5 * 2^23 leaves no fraction bits. std::nearbyint
// is a libm call on baseline x86-64 and dominated the quantisers' time.
inline int round_nearest(float v) {
  v = v < -4194303.f ? -4194303.f : v > 4194303.f ? 4194303.f : v;
  return int((v + 12582912.f) - 12582912.f);
}

// ---------- int8 activation blocks ----------
// For the 32-element weight types: x[i] ~= d * qs[i]; s = d * sum(qs) (the
// offset/min terms of Q4_0 .. Q5_1 need it).
struct A32 { float d; float s; int8_t qs[32]; };
// For the K types: one scale per 256, bsums[k] = sum of qs[16k .. 16k + 15].
struct A256 { float d; int16_t bsums[16]; int8_t qs[256]; };

inline bool uses_a256(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
// Bytes of one quantised activation row of n elements for weights of type t.
inline size_t act_row_bytes(DType t, int64_t n) {
  return uses_a256(t) ? size_t(n / 256) * sizeof(A256) : size_t(n / 32) * sizeof(A32);
}
// x [n] -> activation blocks for weight type t (shared by every ISA level, so
// every level multiplies the same integers).
void quantize_act(DType t, const float* x, int64_t n, std::byte* dst);

// ---------- kernel tables ----------
// Tokens one weight row is multiplied with per pass (the prefill tile).
constexpr int kMaxNT = 4;
// Tokens per call of a GroupDot (the _R16 kernels) at most; a level says how
// many its kernel for a type takes (Kernels::group_nt).
constexpr int kMaxGroupNT = 8;
// f(std::integral_constant<int, n>) for n in 1..8 (8 for anything larger).
template <class F>
inline void with_1to8(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}
// f(std::integral_constant<int, n>) for n in 1..4 (4 for anything larger):
// a runtime row or token count -> the kernel instantiated for it.
template <class F>
inline void with_1to4(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}
// out[t] = W_row · x_t for t < nt <= kMaxNT; the rows of activation blocks are
// `xstride` bytes apart, `nb` weight blocks per row. Each token's sum is
// computed by the same instructions whatever nt is (batch invariance).
using RowDot = void (*)(const std::byte* w, const std::byte* xq, size_t xstride, int64_t nb, int nt, float* out);
// A RowDot entry point `name` over name##_t<ARGS..., NT>.
#define PTLLM_QDISPATCH(name, ...)                                                                     \
  void name(const std::byte* w, const std::byte* xq, size_t xs, int64_t nb, int nt, float* out) {     \
    ::ptllm::ops::q::with_1to4(nt, [&](auto NT) { name##_t<__VA_ARGS__ __VA_OPT__(, ) NT()>(w, xq, xs, nb, out); }); \
  }
// x [n] -> activation blocks (quantize_act's bytes exactly, at every level).
using ActQuant = void (*)(DType t, const float* x, int64_t n, std::byte* dst);
// Rows per call of a TileDot, at most.
constexpr int kMaxTileRows = 16;
// Rows of the 4 x 4 register tiles (Q8_0 and the K types at AVX-512).
constexpr int kTileRows = 4;
// A tile's activations for the 32-element types: each row of A32 blocks
// re-laid once per call (TileActs), so that a token's operands cost the tile
// nothing but loads. Q4_0's tile (16 rows in the lanes) and the Q4_0_R16 and
// Q8_0_R16 kernels take TileBlocks: per block the codes, the scale and the
// integer seed -8 * sum(codes) that makes the tile's unsigned x signed
// product exact (Q8_0_R16 shifts it to -128 * sum(codes)).
struct TileBlock { float d; int32_t seed; int8_t qs[32]; };
// Q8_0's tile (4 rows in the lanes of two blocks) takes TilePairs instead:
// blocks 2p and 2p + 1 (the last alone when the count is odd, its second half
// zero) with the codes made unsigned, the scales spread over the lanes (the
// seed is the weight row's, made in the tile).
struct TilePair { int8_t qs[64]; float d[16]; };
// Room for either layout (a TilePair is 64 bytes per block, a TileBlock 40).
inline size_t tile_row_bytes(int64_t nb) {
  return std::max(size_t((nb + 1) / 2) * sizeof(TilePair), size_t(nb) * sizeof(TileBlock));
}
// One row of nb A32 blocks -> tile_row_bytes(nb) bytes for weights of type t.
using TileActs = void (*)(DType t, const std::byte* a32, int64_t nb, std::byte* dst);
// out[r * kMaxNT + t] = W_row_r · x_t for r < nr <= the type's tile_rows, t <
// nt <= kMaxNT; weight rows are `wstride` bytes apart, activation rows `xs`
// bytes (TileActs' layout for the 32-element types, the A256 rows for the K
// types). A level that has one for a type computes every (row, token) sum
// with the same instructions whatever nr and nt are, so a result depends
// neither on how many tokens nor on which rows share the tile.
using TileDot = void (*)(const std::byte* w, size_t wstride, int nr, const std::byte* xt, size_t xs, int64_t nb, int nt,
                         float* out);
// The _R16 types' kernels: the 16 rows of one group (w: its first byte) times
// nt <= Kernels::group_nt tokens, stored straight into y: y[t * ystride + r] = W_row_r ·
// x_t + bias[r] (bias may be null: + 0). Activations as the stored type's
// TileDot takes them. Writing whole vectors of 16 rows per token spares the
// [row][token] scratch and the scalar copy out of it, which cost as much as
// the arithmetic at the 256-wide rows of small models.
using GroupDot = void (*)(const std::byte* w, const std::byte* xt, size_t xs, int64_t nb, int nt, const float* bias,
                          float* y, int64_t ystride);
struct Kernels {
  ActQuant quantize_act;
  RowDot dot[8];  // by DType, Q8_0 first
  // Register-tiled rows x tokens; where a type has one, it replaces `dot`.
  TileDot tile[8] = {};
  // Rows per tile call with several tokens and with one (one token may go
  // row by row: it is bound by the weight stream, prefetched per row).
  uint8_t tile_rows[8] = {}, tile_rows1[8] = {};
  TileActs tile_acts = nullptr;
  // The _R16 types (core/dtype.h), by their stored type's index; the
  // activations are the tile layout of tile_layout_type (TileBlocks for
  // Q4_0_R16 and Q8_0_R16) or the A256 rows (Q4_K). Null where the level has
  // none (run_rows then unpacks each group into stored rows).
  GroupDot tile_r16[8] = {};
  // Tokens per tile_r16 call, at most (<= kMaxGroupNT; 0: kMaxNT).
  uint8_t group_nt[8] = {};
};
// The stored type whose activation blocks (and row kernels) a type uses:
// an _R16 type is its stored type's blocks re-laid.
constexpr DType kernel_type(DType t) {
  return t == DType::Q4_0_R16 ? DType::Q4_0 : t == DType::Q4_K_R16 ? DType::Q4_K : t == DType::Q8_0_R16 ? DType::Q8_0 : t;
}
// Index into Kernels' per-type tables (an _R16 type shares its stored type's).
constexpr int kernel_index(DType t) { return int(kernel_type(t)) - int(DType::Q8_0); }
// The type whose tile layout of the A32 rows a weight of type t is multiplied
// with under the table k: Q8_0_R16's 16-row kernel reads Q4_0's TileBlocks
// (the same A32 rows, Q4_0's re-lay); without that kernel its groups run as
// Q8_0 rows, which take Q8_0's TilePairs. Any other type: its stored type.
inline DType tile_layout_type(const Kernels& k, DType t) {
  return t == DType::Q8_0_R16 && k.tile_r16[kernel_index(t)] ? DType::Q4_0 : kernel_type(t);
}

const Kernels& kernels_scalar();
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();  // AVX-512 VNNI (with VL/BW); AVX2 if the CPU lacks them
// arm64 (quant_neon.cc): ASIMD widening multiplies, and SDOT (armv8.2 dotprod).
const Kernels& kernels_neon();
const Kernels& kernels_neon_dotprod();
// The table for the current ops::simd_level().
const Kernels& kernels();

}  // namespace ptllm::ops::q
