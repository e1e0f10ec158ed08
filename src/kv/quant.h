// KIVI-style asymmetric (affine) quantisation primitives shared by the
// quantised K and V stores.
//
//   scale = max(kScaleFloor, (max - zero) / (qmax - qmin)),  zero = min
//   q     = clamp(round((x - zero) / scale + qmin), qmin, qmax)
//   x'    = (q - qmin) * scale + zero
//
// Codes are stored as the offset u = q - qmin (0..qmax-qmin), one byte each
// for int8, two per byte for int4 and four per byte for int2. Scales and zeros are stored as fp16
// (`Half`), which on purpose has no arithmetic: the only way to use one is
// widen() to fp32, so fp16 arithmetic on scales cannot happen by accident.
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
inline constexpr QuantRange kInt2Range{-2, 1, 2};
// A collapsed range (qmax == qmin) would divide by zero in the scale formula.
static_assert(kInt8Range.levels() == 255 && kInt4Range.levels() == 15 && kInt2Range.levels() == 3,
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

// Parameters for values in [min, max]. zero is rounded down and scale up to
// fp16 so every value in [min, max] stays inside the code range: the
// round-trip error is then at most scale/2 (scale = the stored fp16 scale).
AffineParams choose_params(float min, float max, QuantRange r);
inline WideParams widen(AffineParams p) {
  WideParams w;
  w.scale = p.scale.widen();
  w.zero = p.zero.widen();
  w.inv_scale = 1.0f / w.scale;  // scale >= kScaleFloor after widening: finite
  return w;
}

// u = q - qmin for x; NaN maps to 0, out-of-range values clamp.
inline uint8_t quantise(float x, const WideParams& w, QuantRange r) {
  float t = (x - w.zero) * w.inv_scale;
  t = t > 0.f ? t : 0.f;  // also catches NaN
  const float hi = float(r.levels());
  t = t < hi ? t : hi;
  return uint8_t(int(t + 0.5f));
}
inline float dequantise(uint8_t u, const WideParams& w) { return float(u) * w.scale + w.zero; }

// Bytes of one packed row of n codes.
constexpr size_t row_bytes(int64_t n, QuantRange r) {
  return r.bits == 8 ? size_t(n) : r.bits == 4 ? size_t(n + 1) / 2 : size_t(n + 3) / 4;
}
// Packs codes u[0..n) (each <= r.levels()) into dst (row_bytes(n, r) bytes).
// int4: byte j holds element 2j in the low nibble and 2j+1 in the high one.
// int2: byte j holds element 4j+k in bits 2k..2k+1 (k = 0..3, low bits first).
void pack_row(const uint8_t* u, int64_t n, QuantRange r, uint8_t* dst);
uint8_t code_at(const uint8_t* row, int64_t i, QuantRange r);
void set_code(uint8_t* row, int64_t i, uint8_t u, QuantRange r);

// Dequantises one packed row of n elements into fp32.
// Per channel: element i uses scale[i], zero[i] (K). Per token: every element uses w (V).
void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const float* scale, const float* zero, float* out);
void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const WideParams& per_token, float* out);

// Per-element min/max code over n_rows packed rows (stride bytes apart); umin/umax are updated in place.
// Codes of one packed row as one byte each: returns row itself for int8, else
// unpacks into tmp (>= n bytes) and returns tmp.
const uint8_t* unpack_row(const uint8_t* row, int64_t n, QuantRange r, uint8_t* tmp);

void code_range(const uint8_t* rows, int64_t n_rows, size_t stride, int64_t n, QuantRange r, uint8_t* umin,
                uint8_t* umax);

}  // namespace ptllm::kivi
