// GGUF block-quantised weights (ggml's layouts: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q4_K, Q5_K, Q6_K): exact dequantisation (the reference), quantisation (for
// `convert --type` and quantise-on-load), and matrix products over block-typed
// weights. ops::matmul / matmul_multi / matmul_swiglu / dot_row / to_f32 route
// block types here, so callers normally use those.
//
// The products quantise each activation row once per call to int8 blocks
// (32 elements with an fp32 scale for the 32-element weight types, 256 with
// per-16 sums for the K types) and then run integer dot products: AVX-512 VNNI,
// AVX2 (maddubs) or a scalar reference doing the same integer arithmetic,
// chosen by ops::simd_level(). A row of y is bit-identical whatever n_tokens is.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/ops.h"

namespace ptllm::ops {

// n must be a multiple of block_elems(t); throws ptllm::Error otherwise, or
// when t is not a block type.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Round-to-nearest with ggml's conventions for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 (the
// same bytes as ggml's reference quantiser); for the K types a per-sub-block
// scale/min search minimising the squared error. Scalar: runs at load/convert.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Bytes of a [rows, cols] tensor of type t (cols a multiple of the block).
size_t quantized_bytes(DType t, int64_t rows, int64_t cols);
// src [rows, cols] stored as F32, F16 or BF16 -> dst (quantized_bytes(t, rows,
// cols) bytes), rows in parallel. For quantise-on-load (`--weights q4_k`) and
// `convert --type`.
void quantize_tensor(DType t, const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst);

// y[t, o] = sum_i W[o, i] * x[t, i] (+ bias[o]) for a block-typed W [out, in];
// x [n_tokens, in] fp32, y [n_tokens, out]. Parallel over output rows.
void qmatmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, const TensorView* bias = nullptr);
// matmul_multi / matmul_swiglu for jobs that include block-typed weights.
void qmatmul_multi(const float* x, int64_t n_tokens, const MatmulJob* jobs, int n_jobs);
void qmatmul_swiglu(const TensorView& w_gate, const TensorView& w_up, const float* x, int64_t n_tokens, float* gate,
                    float* up);

// ---------- the _R16 layouts: Q8_0, Q4_0 and Q4_K re-laid for AVX-512 (core/dtype.h) ----------
// The 16-rows-in-lanes Q4_0 kernel reads, per block column, 16 rows' 16 code
// bytes and 16 scales from 16 places a row apart: 16 loads, 12 inserts, 8
// shuffles and a 16-element gather per 512 weights, which bound it near this
// machine's DRAM bandwidth; Q4_K's row kernel was as slow, Q8_0's 4 x 4 tile
// not much faster (docs/BENCHMARKS.md, "Session 16"). Re-laid once at load, a
// block column of 16 rows is a few whole-vector loads, and every lane is one
// row.
//
// The re-laid form of a stored type (Q8_0 -> Q8_0_R16, Q4_0 -> Q4_0_R16, Q4_K -> Q4_K_R16), or
// t itself where there is none; and the stored type of a re-laid one.
DType rows16_type(DType t);
DType rows16_base(DType t);
// data [rows, cols] of type t (Q8_0, Q4_0 or Q4_K; rows a multiple of 16, cols of
// the block) -> rows16_type(t) in place (a 16-row scratch per group). Throws
// on a type or shape it cannot take.
void pack_rows16(DType t, std::byte* data, int64_t rows, int64_t cols);
// One 16-row group of a re-laid tensor of type r16 (its first byte) -> the
// 16 rows in the stored layout (16 * cols / block elements blocks, row-major).
void unpack_rows16(DType r16, const std::byte* group, int64_t cols, std::byte* dst);
// Row `row` (0..15) of that group alone -> dst (one row of the stored layout).
void unpack_row16(DType r16, const std::byte* group, int64_t cols, int row, std::byte* dst);
// Whether re-laying t pays at the current SIMD level: the level has a kernel
// for rows16_type(t) (AVX-512 VNNI). Elsewhere products over a re-laid type
// unpack each group into a scratch first: Q4_0's results exactly, slower.
bool rows16_pays(DType t);

// Exact fp32 dot of one block-typed row with fp32 x (dequantise, then fp32):
// slow, for embedding-style lookups and tests.
float qdot_row_f32(DType t, const void* row, const float* x, int64_t n);

}  // namespace ptllm::ops
