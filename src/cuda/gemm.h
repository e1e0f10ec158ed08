// Dense projections of many rows (batched decode, prefill chunks) as one cuBLAS
// GEMM on the tensor cores: y[M, N] (+)= x[M, K] W^T, W [N, K] row-major (an
// nn.Linear weight) in fp32, fp16 or bf16, fp32 accumulation. cuBLAS is loaded at
// run time (dlopen of libcublas.so.13, then .so.12; PTLLM_CUBLAS=<path> names the
// library): a machine without it keeps the GEMV kernel (kernels.h) for every row
// count, and the build needs no cuBLAS to link. CUDA builds only.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "cuda/kernels.h"

namespace ptllm::cuda {

class Gemm {
 public:
  // The process's cuBLAS, or null (why: load_error()).
  static Gemm* get();
  static const std::string& load_error();
  // fp16/bf16 W: x is first rounded to W's type into xb (M * K elements of 2
  // bytes); fp32 W: x is used as is (fp32 GEMM, no TF32).
  void run(k::Elem e, const void* W, const float* x, void* xb, float* y, int M, int N, int K, bool accumulate,
           cudaStream_t s);

 private:
  Gemm() = default;
  void* handle_ = nullptr;
};

}  // namespace ptllm::cuda
