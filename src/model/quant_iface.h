// The block-quantisation entry points the `quant` branch provides in src/ops
// (ggml's Q8_0 .. Q6_K layouts). Declared weak here so GGUF conversion builds
// before that branch is merged: until then their address is null and the
// quantised paths fail with a clear Error instead of a link error.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace ptllm::ops {
// x [n] -> n / block_elems(t) blocks of block_bytes(t) bytes.
__attribute__((weak)) void quantize_row(DType t, const float* x, void* out, int64_t n);
// n / block_elems(t) blocks -> y [n].
__attribute__((weak)) void dequantize_row(DType t, const void* in, float* y, int64_t n);
}  // namespace ptllm::ops

namespace ptllm {
inline bool have_block_quant() { return &ops::quantize_row != nullptr && &ops::dequantize_row != nullptr; }
}  // namespace ptllm
