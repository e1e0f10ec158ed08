// Shared setup of the micro-benchmarks: random inputs and a random weight
// matrix in any storage type the kernels read.
#pragma once
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/quant.h"
#include "../tests/randn.h"

namespace ptllm::bench {

using test::randn;  // tests/randn.h

// A random weight [out, in] (seed 7, standard deviation `sd`) stored as
// `dtype`: F32, BF16, F16 or a GGUF block type. `view` points into `bytes`.
struct Weights {
  std::vector<std::byte> bytes;
  TensorView view;
  Weights(DType dtype, int64_t out, int64_t in, float sd = 1.f) {
    const auto f = randn(size_t(out * in), 7, sd);
    if (dtype == DType::F32) {
      bytes.resize(f.size() * sizeof(float));
      std::memcpy(bytes.data(), f.data(), bytes.size());
    } else if (dtype == DType::BF16 || dtype == DType::F16) {
      bytes.resize(f.size() * 2);
      auto* p = reinterpret_cast<uint16_t*>(bytes.data());
      for (size_t i = 0; i < f.size(); ++i) p[i] = dtype == DType::BF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
    } else if (row_group(dtype) != 1) {  // Q8_0 / Q4_0 / Q4_K re-laid as the engine lays them at load
      const DType base = ops::rows16_base(dtype);
      bytes.resize(ops::quantized_bytes(base, out, in));
      ops::quantize_tensor(base, f.data(), DType::F32, out, in, bytes.data());
      ops::pack_rows16(base, bytes.data(), out, in);
    } else {
      bytes.resize(ops::quantized_bytes(dtype, out, in));
      ops::quantize_tensor(dtype, f.data(), DType::F32, out, in, bytes.data());
    }
    view = TensorView{bytes.data(), dtype, {out, in}};
  }
};

}  // namespace ptllm::bench
