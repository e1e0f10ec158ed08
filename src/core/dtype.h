// Element types of stored tensors and the scalar conversions between them.
// Arithmetic is always fp32; f16/bf16 exist only as storage.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ptllm {

// F32..I64 are element types. Q8_0 .. Q6_K are GGUF's block-quantised weight
// types (ggml's layouts): a row of `cols` elements is cols / block_elems(t)
// blocks of block_bytes(t) bytes each; the kernels live in src/ops.
//
// Q8_0_R16, Q4_0_R16 and Q4_K_R16 are Q8_0, Q4_0 and Q4_K re-laid in memory for the AVX-512
// kernels, never in a file: the same blocks and bytes, but rows go in groups
// of 16, and a group's block column i is one record of 16 blocks' bytes with
// each field side by side: a 2-byte field (a scale) as 16 x 2 bytes, a field
// of 4k bytes as k 64-byte vectors, vector j holding bytes 4j .. 4j + 3 of
// row r in bytes 4r .. 4r + 3 (ops::pack_rows16, ops/quant.h). A row is not
// contiguous, so row pointers (data + r * row bytes) are wrong for them: use
// ops::row_to_f32.
enum class DType : uint8_t { F32, F16, BF16, I8, I4, I32, I64, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q4_0_R16,
                             Q4_K_R16, Q8_0_R16 };

constexpr bool is_block_quantised(DType t) { return t >= DType::Q8_0; }
// Rows stored in interleaved groups (the _R16 types: 16), 1 for row-major types.
constexpr int64_t row_group(DType t) {
  return t == DType::Q4_0_R16 || t == DType::Q4_K_R16 || t == DType::Q8_0_R16 ? 16 : 1;
}

// Elements per block (1 for element types).
constexpr size_t block_elems(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q4_0_R16:
    case DType::Q8_0_R16:
      return 32;
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q4_K_R16: return 256;
    default: return 1;
  }
}

// Bytes per block: Q8_0 = f16 d + 32 i8; Q4_0 = d + 16 nibble bytes; Q4_1 = d, m
// + 16; Q5_0 = d + 4 high-bit bytes + 16; Q5_1 = d, m + 4 + 16; Q4_K = d, dmin +
// 12 packed 6-bit scales/mins + 128; Q5_K = the same + 32 high-bit bytes; Q6_K =
// 128 low nibbles + 64 high 2-bit + 16 i8 scales + f16 d.
constexpr size_t block_bytes(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q8_0_R16: return 34;
    case DType::Q4_0: case DType::Q4_0_R16: return 18;
    case DType::Q4_1: return 20;
    case DType::Q5_0: return 22;
    case DType::Q5_1: return 24;
    case DType::Q4_K: case DType::Q4_K_R16: return 144;
    case DType::Q5_K: return 176;
    case DType::Q6_K: return 210;
    default: return 0;
  }
}

// Bytes per element; I4 is packed two per byte and block types have no
// per-element size: both report 0 here (use storage_bytes()).
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::I8: return 1;
    case DType::I64: return 8;
    default: return 0;
  }
}

// Bytes needed for n elements (rounds packed int4 up to whole bytes, block
// types up to whole blocks; a block type's rows hold whole blocks).
constexpr size_t storage_bytes(DType t, size_t n) {
  if (is_block_quantised(t)) return (n + block_elems(t) - 1) / block_elems(t) * block_bytes(t);
  return t == DType::I4 ? (n + 1) / 2 : n * dtype_size(t);
}

std::string_view dtype_name(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even, NaN stays NaN (matches torch's .to(bfloat16)).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even with overflow to inf and gradual underflow.
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf
  if (x < 0x38800000u) {  // subnormal or zero in f16
    if (x < 0x33000000u) return uint16_t(sign);
    const uint32_t e = x >> 23;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = x + 0xfffu + ((x >> 13) & 1u);
  r -= (112u << 23);
  return uint16_t(sign | (r >> 13));
}

}  // namespace ptllm
