#include "ops/kivi_format.h"

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

}  // namespace ptllm::kivi
