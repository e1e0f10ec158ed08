// The query folded into one K group's per-channel parameters: shared by the
// x86 and NEON KIVI key kernels (internal to src/ops).
#pragma once
#include <cstdint>

#include "ops/kivi_format.h"
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

// `to_f32` widens one fp16 parameter: the portable conversion, F16C or FCVT,
// whichever the calling kernel's ISA has (all exact, so the same coefficients).
template <class ToF32>
inline void fold_key_group(const float* q, const kivi::AffineParams* p, int64_t half, float scale, KeyCoef& c,
                           ToF32 to_f32) {
  for (int64_t i = 0; i < half; ++i) {
    const float ls = to_f32(p[i].scale), lz = to_f32(p[i].zero);
    const float hs = to_f32(p[i + half].scale), hz = to_f32(p[i + half].zero);
    const float ql = q[i] * scale, qh = q[i + half] * scale;
    c.P[i] = ql * ls;
    c.Q[i] = qh * hs;
    c.X[i] = qh * ls;
    c.Y[i] = ql * hs;
    c.C1[i] = ql * lz + qh * hz;
    c.C2[i] = qh * lz - ql * hz;
  }
}

}  // namespace ptllm::ops::detail
