// KIVI-style asymmetric (affine) quantisation primitives shared by the
// quantised K and V stores.
//
//   scale = max(kScaleFloor, (max - zero) / (qmax - qmin)),  zero = min
//   q     = clamp(round((x - zero) / scale + qmin), qmin, qmax)
//   x'    = (q - qmin) * scale + zero
//
// Codes are stored as the offset u = q - qmin (0..qmax-qmin), one byte each
// for int8, two per byte for int4, four per byte for int2, eight per 3 bytes for int3. Scales and zeros are stored as fp16
// (`Half`), which on purpose has no arithmetic: the only way to use one is
// widen() to fp32, so fp16 arithmetic on scales cannot happen by accident.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/kivi_format.h"  // Half, QuantRange, AffineParams, WideParams, row_bytes, unpack_row

namespace ptllm::kivi {

// Parameters for values in [min, max]. zero is rounded down and scale up to
// fp16 so every value in [min, max] stays inside the code range: the
// round-trip error is then at most scale/2 (scale = the stored fp16 scale).
AffineParams choose_params(float min, float max, QuantRange r);

// u = q - qmin for x; NaN maps to 0, out-of-range values clamp.
inline uint8_t quantise(float x, const WideParams& w, QuantRange r) {
  float t = (x - w.zero) * w.inv_scale;
  t = t > 0.f ? t : 0.f;  // also catches NaN
  const float hi = float(r.levels());
  t = t < hi ? t : hi;
  return uint8_t(int(t + 0.5f));
}
inline float dequantise(uint8_t u, const WideParams& w) { return float(u) * w.scale + w.zero; }

// Packs codes u[0..n) (each <= r.levels()) into dst (row_bytes(n, r) bytes).
// int4: byte j holds element 2j in the low nibble and 2j+1 in the high one.
// int2: byte j holds element 4j+k in bits 2k..2k+1 (k = 0..3, low bits first).
// int3: element i in bits 3i..3i+2 of the row's little-endian bit stream (8 per 3 bytes).
void pack_row(const uint8_t* u, int64_t n, QuantRange r, uint8_t* dst);
uint8_t code_at(const uint8_t* row, int64_t i, QuantRange r);
void set_code(uint8_t* row, int64_t i, uint8_t u, QuantRange r);

// Dequantises one packed row of n elements into fp32.
// Per channel: element i uses scale[i], zero[i] (K). Per token: every element uses w (V).
void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const float* scale, const float* zero, float* out);
void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const WideParams& per_token, float* out);

// Per-element min/max code over n_rows packed rows (stride bytes apart); umin/umax are updated in place.
void code_range(const uint8_t* rows, int64_t n_rows, size_t stride, int64_t n, QuantRange r, uint8_t* umin,
                uint8_t* umax);

}  // namespace ptllm::kivi
