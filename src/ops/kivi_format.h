// The storage format of KIVI codes and their parameters, shared by the
// quantised K/V stores (src/kv) and the kernels that read them (kivi_kernels.h).
//
//   scale = max(kScaleFloor, (max - zero) / (qmax - qmin)),  zero = min
//   x'    = u * scale + zero,  u = q - qmin in 0 .. qmax - qmin
//
// Codes u are stored one byte each for int8, two per byte for int4 (element 2j
// in the low nibble of byte j), four per byte for int2 (element 4j+k in bits
// 2k..2k+1) and eight per three bytes for int3: the row is one little-endian
// bit stream, element i in bits 3i..3i+2 (so element 8j+k is in bits 3k..3k+2
// of the 24-bit word bytes 3j..3j+2, low byte first; a row of n codes is
// ceil(3n/8) bytes). Scales and zeros are fp16 (`Half`), which on purpose has no
// arithmetic: the only way to use one is widen() to fp32, so fp16 arithmetic on
// scales cannot happen by accident. (Choosing parameters and quantising:
// kv/quant.h.)
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ptllm::kivi {

// An fp16 value as stored. No operators: call widen() before any arithmetic.
class Half {
 public:
  Half() = default;
  static Half nearest(float x);     // round to nearest even (clamped to the finite fp16 range)
  static Half round_down(float x);  // largest fp16 <= x (clamped)
  static Half round_up(float x);    // smallest fp16 >= x (clamped)
  static Half from_bits(uint16_t b) { return Half(b); }
  float widen() const { return f16_to_f32(bits_); }
  uint16_t bits() const { return bits_; }

 private:
  explicit Half(uint16_t b) : bits_(b) {}
  uint16_t bits_ = 0;
};
static_assert(sizeof(Half) == 2, "Half is stored as two bytes");

// Integer code range of one quantised element.
struct QuantRange {
  int qmin, qmax, bits;
  constexpr int levels() const { return qmax - qmin; }
};
inline constexpr QuantRange kInt8Range{-128, 127, 8};
inline constexpr QuantRange kInt4Range{-8, 7, 4};
inline constexpr QuantRange kInt3Range{-4, 3, 3};
inline constexpr QuantRange kInt2Range{-2, 1, 2};
// A collapsed range (qmax == qmin) would divide by zero in the scale formula.
static_assert(kInt8Range.levels() == 255 && kInt4Range.levels() == 15 && kInt3Range.levels() == 7 &&
                  kInt2Range.levels() == 3,
              "clamp ranges must not collapse");
// Smallest scale: a zero range (constant channel/token) would otherwise give scale 0 and 0/0.
inline constexpr float kScaleFloor = 1e-5f;

// Stored (fp16) quantisation parameters of one channel or one token.
struct AffineParams {
  Half scale, zero;
};
// The same parameters widened to fp32: the only form used in arithmetic.
struct WideParams {
  float scale = 1, zero = 0, inv_scale = 1;
};

inline WideParams widen(AffineParams p) {
  WideParams w;
  w.scale = p.scale.widen();
  w.zero = p.zero.widen();
  w.inv_scale = 1.0f / w.scale;  // scale >= kScaleFloor after widening: finite
  return w;
}

// Bytes of one packed row of n codes.
constexpr size_t row_bytes(int64_t n, QuantRange r) {
  return r.bits == 8   ? size_t(n)
         : r.bits == 4 ? size_t(n + 1) / 2
         : r.bits == 3 ? size_t(3 * n + 7) / 8
                       : size_t(n + 3) / 4;
}

// int3 code i of a packed row (bits 3i..3i+2 of the row's bit stream). Reads
// only bytes of the row.
inline uint8_t int3_code(const uint8_t* row, int64_t i) {
  const int64_t bit = 3 * i, byte = bit >> 3;
  const int sh = int(bit & 7);
  unsigned w = row[byte];
  if (sh > 5) w |= unsigned(row[byte + 1]) << 8;  // the code spans two bytes
  return uint8_t((w >> sh) & 7u);
}

// Codes of one packed row as one byte each: returns row itself for int8, else
// unpacks into tmp (>= n bytes) and returns tmp. Inline: the dequantise and
// code-range loops of kv/quant.cc build on it.
inline const uint8_t* unpack_row(const uint8_t* row, int64_t n, QuantRange r, uint8_t* tmp) {
  if (r.bits == 8) return row;
  if (r.bits == 3) {
    // Eight codes per three bytes.
    for (int64_t j = 0; j < n / 8; ++j) {
      const uint32_t w = uint32_t(row[3 * j]) | uint32_t(row[3 * j + 1]) << 8 | uint32_t(row[3 * j + 2]) << 16;
      for (int k = 0; k < 8; ++k) tmp[8 * j + k] = uint8_t((w >> (3 * k)) & 7u);
    }
    for (int64_t i = n / 8 * 8; i < n; ++i) tmp[i] = int3_code(row, i);
    return tmp;
  }
  if (r.bits == 2) {
    for (int64_t j = 0; j < n / 4; ++j) {
      const uint8_t b = row[j];
      tmp[4 * j] = b & 0x03;
      tmp[4 * j + 1] = (b >> 2) & 0x03;
      tmp[4 * j + 2] = (b >> 4) & 0x03;
      tmp[4 * j + 3] = b >> 6;
    }
    for (int64_t i = n / 4 * 4; i < n; ++i) tmp[i] = (row[i / 4] >> (2 * (i & 3))) & 0x03;
    return tmp;
  }
  for (int64_t j = 0; j < n / 2; ++j) {
    tmp[2 * j] = row[j] & 0x0f;
    tmp[2 * j + 1] = row[j] >> 4;
  }
  if (n & 1) tmp[n - 1] = row[n / 2] & 0x0f;
  return tmp;
}

}  // namespace ptllm::kivi
