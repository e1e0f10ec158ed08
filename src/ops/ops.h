// Compute kernels. Every kernel has a scalar reference implementation; the
// SIMD variants (AVX2+FMA+F16C, AVX-512F) are selected from the CPU's
// features by one mechanism (dispatch.h) and can be forced for tests with
// set_simd_level(). Arithmetic is fp32 whatever the storage dtype.
// Files: ops.cc (dispatch, dots, to_f32), matmul.cc, elementwise.cc
// (rmsnorm, silu_mul, softmax, axpy), attention_kernels.cc (dot_rows*,
// weighted_sum_rows), kivi_kernels.h (attention on packed KIVI codes), rope.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace ptllm::ops {

// x86-64: Scalar < Avx2 (AVX2+FMA+F16C) < Avx512 (AVX-512F). arm64: Scalar <
// Neon (ASIMD, baseline on every arm64 CPU) < NeonDotprod (+ the SDOT/UDOT
// int8 dot product, armv8.2 `asimddp`: Graviton 2+, Apple M1+).
enum class SimdLevel { Scalar, Avx2, Avx512, Neon, NeonDotprod };
SimdLevel best_simd_level();          // what this CPU supports
SimdLevel simd_level();               // what is in use
// Clamps to what the CPU runs: the highest available level not above `level`
// in the enum's order (so an x86 level on arm64 means Scalar).
void set_simd_level(SimdLevel level);
std::string_view simd_level_name(SimdLevel level);
// Every level this CPU runs, Scalar first, in increasing order (tests compare
// each one with the scalar reference).
std::vector<SimdLevel> available_simd_levels();
// The CPU's SIMD features in words, e.g. "avx2 fma f16c" or "neon dotprod
// i8mm bf16" (from getauxval(AT_HWCAP*) on Linux, sysctl on macOS).
std::string cpu_features();

// Threads used by parallel kernels (OpenMP). 0 = all cores.
void set_num_threads(int n);
int num_threads();
// Multiply-adds (weight elements x rows) at or above which a matmul, or a
// step's attention, is split across threads; below it one thread does it all.
// Every split point is chosen so that each output element's arithmetic is the
// same whichever thread computes it, so the threshold changes timing only,
// never results. Default: 1<<16 when OpenMP threads spin between regions,
// 1<<20 when they sleep (OMP_WAIT_POLICY=passive: each region wakes them);
// PTLLM_PARALLEL_MIN_WORK overrides it. Read once, at first use.
int64_t parallel_min_work();

float dot_f32(const float* a, const float* b, int64_t n);
// Dot of a row stored as `dtype` (F32, F16 or BF16) with fp32 x.
float dot_row(const void* row, DType dtype, const float* x, int64_t n);
// y[i] += a * x[i]
void axpy(float a, const float* x, float* y, int64_t n);
// Converts n stored elements to fp32.
void to_f32(const void* src, DType dtype, float* dst, int64_t n);
// Row r of a 2-D weight -> dst [cols] fp32, for every stored dtype (the
// embedding lookup); the only way to read one row of the _R16 types.
void row_to_f32(const TensorView& w, int64_t r, float* dst);
// A whole tensor -> dst [numel] fp32 (row-major whatever the layout).
void tensor_to_f32(const TensorView& w, float* dst);

// y[t, o] = sum_i W[o, i] * x[t, i] (+ bias[o]); W is [out, in] in F32/F16/BF16,
// x is [n_tokens, in], y is [n_tokens, out]. Parallel over output rows.
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, const TensorView* bias = nullptr);

// One input x [n_tokens, in] multiplied by several weights in a single
// parallel region (e.g. q/k/v): ys[j] = x · W_j^T (+ bias_j). Same results as
// calling matmul() for each job; saves the fork/join of separate calls.
struct MatmulJob {
  const TensorView* w = nullptr;
  float* y = nullptr;                  // [n_tokens, w->rows()]
  const TensorView* bias = nullptr;  // [w->rows()] or null
};
void matmul_multi(const float* x, int64_t n_tokens, const MatmulJob* jobs, int n_jobs);

// SwiGLU feed-forward input: gate = silu(x · Wg^T) * (x · Wu^T), [n_tokens, ffn].
// `up` is scratch of the same size. Equals matmul + matmul + silu_mul.
void matmul_swiglu(const TensorView& w_gate, const TensorView& w_up, const float* x, int64_t n_tokens, float* gate,
                   float* up);

// Batched decode: n_rows independent rows of x (one token of each of several
// sequences) through the same weights. Each output row is bit-identical to
// matmul_multi / matmul_swiglu with n_tokens = 1 on that row alone (the same
// per-row reduction order whatever n_rows), so a sequence's logits do not
// depend on what it is batched with. Weights are read from memory once per
// call: small blocks of weight rows are reused from L1 for every row of x.
void matmul_rows(const float* x, int64_t n_rows, const MatmulJob* jobs, int n_jobs);
void matmul_swiglu_rows(const TensorView& w_gate, const TensorView& w_up, const float* x, int64_t n_rows, float* gate,
                        float* up);

// Attention building blocks over fp32 rows [len, hd] (one K or V head):
// scores[t] = scale * (q · k[t, :])
void dot_rows(const float* q, const float* k, int64_t len, int64_t hd, float scale, float* scores);
// out[:] += sum_t p[t] * v[t, :], rows with p[t] == 0 skipped (masked keys).
void weighted_sum_rows(const float* p, const float* v, int64_t len, int64_t hd, float* out);
// weighted_sum_rows(p[j], v, len, hd, out[j]) for j < m <= kMultiQueries, bit
// for bit, over the same value rows: several queries' sums (independent FMA
// chains, each in key order) share each row's loads. At head_dim 32 one
// query's sum is one chain of 2 FMAs per key, bound by the FMA latency.
constexpr int kMultiQueries = 4;
void weighted_sum_rows_multi(const float* const* p, int m, const float* v, int64_t len, int64_t hd, float* const* out);
// weighted_sum_rows(p[j], v[j], len, hd, out[j]) for j < m <= kMultiQueries,
// bit for bit, each query over its own value rows (a decode step's heads of
// different KV heads): the m FMA chains interleave.
void weighted_sum_rows_heads(const float* const* p, const float* const* v, int m, int64_t len, int64_t hd,
                             float* const* out);
// Several queries against keys laid out transposed, for prefill: kt [hd, ld]
// (key t is column t), scores[j][t] = scale * sum_d q[j][d] kt[d][t] for
// j < m <= kMultiQueries and t < len, summed in d order (a product, then an
// FMA per d), so every level gives the scalar reference's bits. Lanes run
// over keys: no horizontal sums, and each key column is loaded once for the
// m queries. The kernels write whole blocks of 16 keys: scores[j] and the
// columns of kt need room up to round_up(len, 16) (the padding's scores are
// for no key).
void dot_rows_transposed(const float* const* q, int m, const float* kt, int64_t ld, int64_t len, int64_t hd,
                         float scale, float* const* scores);
// Pre-RoPE keys: scores[t] = scale * q · R(t) k[t, :], where R(t) rotates the
// rotate-half pairs (i, i + hd/2) by kcos/ksin row t ([n, hd/2] each, starting
// at the same slot as k). The key is never rotated in memory.
void dot_rows_rotated(const float* q, const float* k, int64_t n, int64_t hd, const float* kcos, const float* ksin,
                      float scale, float* scores);

// out = x / rms(x) * weight, over `dim` elements, for n rows.
void rmsnorm(const float* x, const TensorView& weight, double eps, int64_t n, int64_t dim, float* out);
// gate[i] = silu(gate[i]) * up[i]
void silu_mul(float* gate, const float* up, int64_t n);
// In-place numerically stable softmax.
void softmax(float* x, int64_t n);

// Sampling over a vocabulary (sample_kernels.cc; sampling/sampler.cc). Both return the
// same bits at every SIMD level and on every platform (a seed reproduces a run anywhere).
// Index of the largest of x[0..n): the first on ties; NaNs are never chosen (0 when every
// value is NaN).
int64_t argmax(const float* x, int64_t n);
// w[i] = e^((double(x[i]) - m) * s) for i < n (0 where the exponent is below -700), and
// their sum: 8 partial sums (sum j over i = j mod 8, each in index order) added as
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). e^t is computed from IEEE add,
// multiply and fused multiply-add only, within 2 ulp of the libm's for t in [-700, 0].
double exp_weights(const float* x, int64_t n, double m, double s, double* w);
// That e^t for one t <= 0, for tests.
double exp_reference(double t);

}  // namespace ptllm::ops
