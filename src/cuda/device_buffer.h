// Host-side helpers of the CUDA backend (CUDA builds only): a CUDA status
// check that throws ptllm::Error, and an owned device allocation.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/error.h"

namespace ptllm::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA {}: {}", what, cudaGetErrorString(e));
}

// A device allocation freed with its owner; reserve() grows it (contents lost).
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void reserve(size_t b) {
    if (b <= bytes) return;
    if (p) cudaFree(p);
    p = nullptr;
    check(cudaMalloc(&p, b), "cudaMalloc");
    bytes = b;
  }
  float* f() const { return static_cast<float*>(p); }
};

}  // namespace ptllm::cuda
