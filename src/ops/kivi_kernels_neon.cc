// NEON variants of the fused KIVI attention kernels (kivi_kernels.h): key
// scores straight from int8 / int4 / int2 codes in a ring of rows, turned by
// the per-slot RoPE table (pre-RoPE keys), and the value sum. The same algebra
// as the scalar reference in kivi_kernels.cc: a group's scales and zeros are
// folded into the query once (P, Q, X, Y, C1, C2 per channel pair), then
//   score(t) = sum_i cos_ti (P_i u_i + Q_i u_{i+h} + C1_i) + sin_ti (X_i u_i - Y_i u_{i+h} + C2_i)
//   out_i   += sum_t (p_t s_t) u_ti + sum_t p_t z_t.
// Codes are unpacked 16 at a time (elements [16b, 16b + 16) of a row) and
// widened u8 -> u16 -> u32 -> fp32. Sizes: head_dim/2 a multiple of 16 (K) and
// head_dim a multiple of 16 (V), up to kMaxHeadDim; others take the reference.
#include <arm_neon.h>

#include <cstring>

#include "ops/kivi_fold.h"
#include "ops/neon_kernels.h"
#include "ops/rope.h"

namespace ptllm::ops::neon {
namespace {

inline float h2f(kivi::Half h) {
  const uint16_t b = h.bits();
  __fp16 v;
  std::memcpy(&v, &b, 2);
  return float(v);  // FCVT: exact, as kivi::Half::widen
}

// Elements [16b, 16b + 16) of a packed row as bytes.
template <int BITS>
inline uint8x16_t codes16(const uint8_t* row, int64_t b) {
  if constexpr (BITS == 8) {
    return vld1q_u8(row + 16 * b);
  } else if constexpr (BITS == 4) {
    // Byte j: element 2j in the low nibble, 2j + 1 in the high one.
    const uint8x8_t x = vld1_u8(row + 8 * b);
    const uint8x8_t lo = vand_u8(x, vdup_n_u8(0x0f)), hi = vshr_n_u8(x, 4);
    return vcombine_u8(vzip1_u8(lo, hi), vzip2_u8(lo, hi));
  } else {
    // Byte j: element 4j + k in bits 2k..2k+1. Each byte to four lanes, then
    // lane 4j + k shifted right by 2k.
    uint32_t w;
    std::memcpy(&w, row + 4 * b, 4);
    const uint8x16_t idx = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    const int8x16_t sh = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
    const uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(w)), idx);
    return vandq_u8(vshlq_u8(v, sh), vdupq_n_u8(0x03));
  }
}

// 16 bytes -> four fp32 vectors (elements 0..3, 4..7, 8..11, 12..15).
inline void widen16(uint8x16_t x, float32x4_t* f) {
  const uint16x8_t lo = vmovl_u8(vget_low_u8(x)), hi = vmovl_high_u8(x);
  f[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
  f[1] = vcvtq_f32_u32(vmovl_high_u16(lo));
  f[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
  f[3] = vcvtq_f32_u32(vmovl_high_u16(hi));
}

using detail::KeyCoef;

template <int BITS>
void key_scores(const KiviCodes& k, int64_t t0, int64_t n, const kivi::AffineParams* params, const float* q,
                float scale, const float* kcos, const float* ksin, float* scores) {
  const int64_t half = k.head_dim / 2, nb = half / 16;
  KeyCoef c;
  detail::fold_key_group(q, params, half, scale, c);
  int64_t pr = k.phys(t0);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = k.base + size_t(pr) * k.row_bytes;
    if (++pr == k.cap) pr = 0;
    float32x4_t acc0 = vdupq_n_f32(0.f), acc1 = acc0;
    const float* cs = kcos + j * half;
    const float* sn = ksin + j * half;
    for (int64_t b = 0; b < nb; ++b) {
      float32x4_t ul[4], uh[4];
      widen16(codes16<BITS>(row, b), ul);
      widen16(codes16<BITS>(row, nb + b), uh);
      for (int s = 0; s < 4; ++s) {
        const int64_t i = 16 * b + 4 * s;
        const float32x4_t a = vfmaq_f32(vfmaq_f32(vld1q_f32(c.C1 + i), vld1q_f32(c.Q + i), uh[s]), vld1q_f32(c.P + i), ul[s]);
        const float32x4_t bb =
            vfmaq_f32(vfmsq_f32(vld1q_f32(c.C2 + i), vld1q_f32(c.Y + i), uh[s]), vld1q_f32(c.X + i), ul[s]);
        acc0 = vfmaq_f32(acc0, vld1q_f32(cs + i), a);
        acc1 = vfmaq_f32(acc1, vld1q_f32(sn + i), bb);
      }
    }
    scores[j] = vaddvq_f32(vaddq_f32(acc0, acc1));
  }
}

template <int BITS>
void value_sum(const KiviCodes& v, int64_t t0, int64_t n, const kivi::AffineParams* params, const float* p,
               float* out) {
  const int64_t hd = v.head_dim, nb = hd / 16;
  alignas(16) float acc[kMaxHeadDim] = {};
  float bias = 0.f;
  int64_t pr = v.phys(t0);
  for (int64_t j = 0; j < n; ++j, pr = pr + 1 == v.cap ? 0 : pr + 1) {
    if (p[j] == 0.f) continue;  // masked
    const float32x4_t ps = vdupq_n_f32(p[j] * h2f(params[pr].scale));
    bias += p[j] * h2f(params[pr].zero);
    const uint8_t* row = v.base + size_t(pr) * v.row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      float32x4_t u[4];
      widen16(codes16<BITS>(row, b), u);
      for (int s = 0; s < 4; ++s) {
        float* a = acc + 16 * b + 4 * s;
        vst1q_f32(a, vfmaq_f32(vld1q_f32(a), ps, u[s]));
      }
    }
  }
  const float32x4_t bv = vdupq_n_f32(bias);
  for (int64_t i = 0; i < hd; i += 4) vst1q_f32(out + i, vaddq_f32(vld1q_f32(out + i), vaddq_f32(vld1q_f32(acc + i), bv)));
}

}  // namespace

KiviKeyFn kivi_key_for(int bits, int64_t head_dim) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim || (head_dim / 2) % 16 != 0 || head_dim % 2 != 0) return nullptr;
  switch (bits) {
    case 8: return key_scores<8>;
    case 4: return key_scores<4>;
    case 2: return key_scores<2>;
    default: return nullptr;
  }
}

KiviValueFn kivi_value_for(int bits, int64_t head_dim) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim || head_dim % 16 != 0) return nullptr;
  switch (bits) {
    case 8: return value_sum<8>;
    case 4: return value_sum<4>;
    case 2: return value_sum<2>;
    default: return nullptr;
  }
}

}  // namespace ptllm::ops::neon
