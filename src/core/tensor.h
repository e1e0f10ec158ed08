// Non-owning view of a stored tensor (usually inside a memory-mapped file).
// Ownership lives elsewhere (MappedFile, std::vector); a view must not
// outlive it. Shapes are row-major, outermost first: a linear weight is
// [out_features, in_features].
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ptllm {

struct TensorView {
  const std::byte* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return storage_bytes(dtype, size_t(numel())); }
  int64_t dim(size_t i) const { return shape.at(i); }
  int64_t rows() const { return shape.empty() ? 1 : shape.front(); }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
  // Element i converted to fp32 (slow path: tests, embedding lookup).
  float at_f32(int64_t i) const {
    switch (dtype) {
      case DType::F32: return as<float>()[i];
      case DType::F16: return f16_to_f32(as<uint16_t>()[i]);
      case DType::BF16: return bf16_to_f32(as<uint16_t>()[i]);
      default: return 0.f;
    }
  }
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace ptllm
