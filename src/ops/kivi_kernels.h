// Attention straight from packed KIVI codes (int8 / int4 / int2 with fp16
// scales and zeros, kivi_format.h), never writing a dequantised K or V. The
// kernels take plain views of the codes; which tokens form a group, where the
// sinks and the fp32 residual are, is the store's business (kv/grouped_store.h).
//
// Keys are stored before RoPE and turned by their slot at read time. With the
// rotate-half pairs (i, i+h) and k = s*u + z,
//   q . R(t) k = sum_i cos_ti (q_i k_i + q_{i+h} k_{i+h}) + sin_ti (q_{i+h} k_i - q_i k_{i+h})
// so a group's per-channel scales and zeros are folded into the query once
// (P = q_i s_i, Q = q_{i+h} s_{i+h}, X = q_{i+h} s_i, Y = q_i s_{i+h} and two
// zero terms) and each token costs a few multiply-adds per code. Values:
//   sum_t p_t (s_t u_t + z_t) = sum_t (p_t s_t) u_t + sum_t p_t z_t.
//
// Each kernel has a scalar reference and AVX2 / AVX-512 variants (dispatch.h)
// for head_dim 32, 64, 128, 256 (K) and 16, 32, 64, 128, 256 (V); other sizes
// take the reference. Per token, 16 codes are unpacked with a few byte shuffles
// and widened to fp32 lanes; the fp16 parameters are widened with F16C.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/kivi_format.h"

namespace ptllm::ops {

// The packed code rows of one head, kept as a ring: [cap, row_bytes] bytes at
// `base`; token j (0 = the oldest held) is at physical row (start + j) mod cap.
struct KiviCodes {
  const uint8_t* base = nullptr;
  size_t row_bytes = 0;  // kivi::row_bytes(head_dim, range)
  int64_t cap = 0, start = 0;
  int64_t head_dim = 0;  // codes per row, even, <= kMaxHeadDim
  kivi::QuantRange range = kivi::kInt8Range;
  int64_t phys(int64_t j) const {
    const int64_t p = start + j;
    return p >= cap ? p - cap : p;
  }
};

// K, tokens [t0, t0 + n) of one group whose per-channel parameters are
// `params` [head_dim]: scores[j] = scale * q . R(j) k_{t0+j}, where R(j) turns
// by kcos/ksin row j ([n, head_dim/2] each). q is one query head, already
// rotated by the query's own angle.
void kivi_key_scores(const KiviCodes& k, int64_t t0, int64_t n, const kivi::AffineParams* params, const float* q,
                     float scale, const float* kcos, const float* ksin, float* scores);

// K quantised per token (k_axis token; keys stored after RoPE, so no turning
// here): tokens [t0, t0 + n) with per-token parameters `params` indexed by
// physical row like the codes ([cap]):
//   scores[j] = scale * (s_t sum_i q_i u_ti + z_t sum_i q_i),  t = t0 + j.
void kivi_key_scores_tokens(const KiviCodes& k, int64_t t0, int64_t n, const kivi::AffineParams* params,
                            const float* q, float scale, float* scores);

// V, tokens [t0, t0 + n) with per-token parameters `params` indexed by
// physical row like the codes ([cap]): out[i] += sum_j p[j] v_{t0+j, i}.
// Tokens with p[j] == 0 (masked) are skipped.
void kivi_value_sum(const KiviCodes& v, int64_t t0, int64_t n, const kivi::AffineParams* params, const float* p,
                    float* out);

}  // namespace ptllm::ops
