#include "kv/quant.h"

#include <cmath>

namespace ptllm::kivi {
namespace {

constexpr float kF16Max = 65504.f;

float clamp_finite(float x) {
  if (std::isnan(x)) return 0.f;
  return x < -kF16Max ? -kF16Max : (x > kF16Max ? kF16Max : x);
}
// Neighbouring fp16 bit patterns (finite inputs only; callers clamp first).
uint16_t next_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;  // +0 -> smallest negative subnormal
  if (h & 0x8000u) return uint16_t(h + 1);  // negative (incl. -0): magnitude up
  return uint16_t(h - 1);
}
uint16_t next_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;  // -0 -> smallest positive subnormal
  if (h & 0x8000u) return uint16_t(h - 1);
  return uint16_t(h + 1);
}

}  // namespace

Half Half::nearest(float x) { return Half(f32_to_f16(clamp_finite(x))); }

Half Half::round_down(float x) {
  x = clamp_finite(x);
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) > x) h = next_down(h);
  return Half(h);
}

Half Half::round_up(float x) {
  x = clamp_finite(x);
  uint16_t h = f32_to_f16(x);
  if (f16_to_f32(h) < x) h = next_up(h);
  return Half(h);
}

AffineParams choose_params(float min, float max, QuantRange r) {
  AffineParams p;
  p.zero = Half::round_down(min);
  // Measured from the stored zero, so that the stored zero + levels * scale still reaches max.
  float s = (max - p.zero.widen()) / float(r.levels());
  if (!(s >= kScaleFloor)) s = kScaleFloor;  // zero range, or NaN input
  p.scale = Half::round_up(s);
  return p;
}

void pack_row(const uint8_t* u, int64_t n, QuantRange r, uint8_t* dst) {
  if (r.bits == 8) {
    for (int64_t i = 0; i < n; ++i) dst[i] = u[i];
    return;
  }
  for (int64_t j = 0; 2 * j < n; ++j) {
    const uint8_t lo = u[2 * j] & 0x0f;
    const uint8_t hi = 2 * j + 1 < n ? uint8_t(u[2 * j + 1] & 0x0f) : 0;
    dst[j] = uint8_t(lo | (hi << 4));
  }
}

uint8_t code_at(const uint8_t* row, int64_t i, QuantRange r) {
  if (r.bits == 8) return row[i];
  const uint8_t b = row[i / 2];
  return (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0x0f);
}

void set_code(uint8_t* row, int64_t i, uint8_t u, QuantRange r) {
  if (r.bits == 8) {
    row[i] = u;
    return;
  }
  uint8_t& b = row[i / 2];
  b = (i & 1) ? uint8_t((b & 0x0f) | ((u & 0x0f) << 4)) : uint8_t((b & 0xf0) | (u & 0x0f));
}

void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const float* scale, const float* zero, float* out) {
  if (r.bits == 8) {
    for (int64_t i = 0; i < n; ++i) out[i] = float(row[i]) * scale[i] + zero[i];
    return;
  }
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint8_t b = row[i / 2];
    out[i] = float(b & 0x0f) * scale[i] + zero[i];
    out[i + 1] = float(b >> 4) * scale[i + 1] + zero[i + 1];
  }
  if (i < n) out[i] = float(row[i / 2] & 0x0f) * scale[i] + zero[i];
}

void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const WideParams& w, float* out) {
  if (r.bits == 8) {
    for (int64_t i = 0; i < n; ++i) out[i] = float(row[i]) * w.scale + w.zero;
    return;
  }
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const uint8_t b = row[i / 2];
    out[i] = float(b & 0x0f) * w.scale + w.zero;
    out[i + 1] = float(b >> 4) * w.scale + w.zero;
  }
  if (i < n) out[i] = float(row[i / 2] & 0x0f) * w.scale + w.zero;
}

}  // namespace ptllm::kivi
