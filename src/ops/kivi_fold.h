// The query folded into one K group's per-channel parameters: shared by the
// x86 and NEON KIVI key kernels (internal to src/ops).
#pragma once
#include <cstdint>

#include "ops/kivi_format.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace ptllm::ops::detail {

constexpr int64_t kKiviHalfMax = kMaxHeadDim / 2;

// Per K group: the query folded with the group's per-channel scales and zeros
// (and the softmax scale), for channel pairs (i, i + half):
//   score(t) = sum_i cos_ti (P_i u_i + Q_i u_{i+h} + C1_i) + sin_ti (X_i u_i - Y_i u_{i+h} + C2_i)
struct KeyCoef {
  alignas(64) float P[kKiviHalfMax], Q[kKiviHalfMax], X[kKiviHalfMax], Y[kKiviHalfMax], C1[kKiviHalfMax],
      C2[kKiviHalfMax];
};

// `w` holds the group's parameters widened to fp32, (scale, zero) per channel:
// w[2c], w[2c + 1] (the AffineParams layout, so one to_f32 over the fp16 pairs
// widens them, with F16C / FCVT where the CPU has them: exact, so the same
// coefficients at every level).
inline void fold_key_group(const float* q, const float* w, int64_t half, float scale, KeyCoef& c) {
  for (int64_t i = 0; i < half; ++i) {
    const float ls = w[2 * i], lz = w[2 * i + 1];
    const float hs = w[2 * (i + half)], hz = w[2 * (i + half) + 1];
    const float ql = q[i] * scale, qh = q[i + half] * scale;
    c.P[i] = ql * ls;
    c.Q[i] = qh * hs;
    c.X[i] = qh * ls;
    c.Y[i] = ql * hs;
    c.C1[i] = ql * lz + qh * hz;
    c.C2[i] = qh * lz - ql * hz;
  }
}

// The whole fold of one group: widen its fp16 (scale, zero) pairs, then fold.
inline void fold_key_group(const float* q, const kivi::AffineParams* p, int64_t half, float scale, KeyCoef& c) {
  static_assert(sizeof(kivi::AffineParams) == 2 * sizeof(uint16_t), "AffineParams = two fp16 values");
  alignas(64) float w[4 * kKiviHalfMax];
  to_f32(p, DType::F16, w, 4 * half);
  fold_key_group(q, w, half, scale, c);
}

}  // namespace ptllm::ops::detail
