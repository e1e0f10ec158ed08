// NEON (AArch64 ASIMD) variants of the ops kernels, internal to src/ops. The
// definitions live in src/ops/*_neon.cc, which CMake compiles only on aarch64;
// call sites name them through PTLLM_NEON_FN (dispatch.h), so on x86 these
// declarations are never referenced. Each has the signature and the meaning of
// the scalar reference it stands in for (tests/ops compare them).
#pragma once
#include <cstdint>

#include "ops/kivi_kernels.h"

namespace ptllm::ops::neon {

// Row kernels (ops.cc): fp32 / bf16 / fp16 rows times fp32 x, fp16 -> fp32.
float dot_f32(const float* a, const float* b, int64_t n);
float dot_bf16(const uint16_t* w, const float* x, int64_t n);
float dot_f16(const uint16_t* w, const float* x, int64_t n);
void widen_f16(const uint16_t* src, float* dst, int64_t n);

// Elementwise (elementwise.cc).
void silu_mul(float* gate, const float* up, int64_t n);
void softmax(float* x, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);
// out[0..dim) = x / rms(x) * w for one row (sum of squares in double, as the reference).
void rmsnorm_row(const float* x, const float* w, double eps, int64_t dim, float* out);

// Fused KIVI attention (kivi_kernels_neon.cc): the whole kivi_key_scores /
// kivi_value_sum for (bits, head_dim), or null where there is no NEON
// variant (other code widths, head_dim/2 or head_dim not a multiple of 16).
using KiviKeyFn = void (*)(const KiviCodes& k, int64_t t0, int64_t n, const kivi::AffineParams* params,
                           const float* q, float scale, const float* kcos, const float* ksin, float* scores);
using KiviValueFn = void (*)(const KiviCodes& v, int64_t t0, int64_t n, const kivi::AffineParams* params,
                             const float* p, float* out);
KiviKeyFn kivi_key_for(int bits, int64_t head_dim);
KiviValueFn kivi_value_for(int bits, int64_t head_dim);

}  // namespace ptllm::ops::neon
