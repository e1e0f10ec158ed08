// cuBLAS through dlopen (gemm.h).
#include "cuda/gemm.h"

#include <cublas_api.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace ptllm::cuda {
namespace {

using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct Lib {
  CreateFn create = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;
  std::string error;
};

Lib& lib() {
  static Lib l;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = nullptr;
    if (const char* p = std::getenv("PTLLM_CUBLAS"); p && *p) {
      h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    } else {
      for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"})
        if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    }
    if (!h) {
      const char* e = dlerror();
      l.error = e ? e : "libcublas not found";
      return;
    }
    l.create = reinterpret_cast<CreateFn>(dlsym(h, "cublasCreate_v2"));
    l.set_stream = reinterpret_cast<SetStreamFn>(dlsym(h, "cublasSetStream_v2"));
    l.gemm_ex = reinterpret_cast<GemmExFn>(dlsym(h, "cublasGemmEx"));
    if (!l.create || !l.set_stream || !l.gemm_ex) {
      l.error = "libcublas lacks cublasCreate_v2 / cublasSetStream_v2 / cublasGemmEx";
      l.create = nullptr;
    }
  });
  return l;
}

cudaDataType dtype(k::Elem e) {
  return e == k::Elem::BF16 ? CUDA_R_16BF : e == k::Elem::F16 ? CUDA_R_16F : CUDA_R_32F;
}

}  // namespace

Gemm* Gemm::get() {
  static Gemm* g = [] () -> Gemm* {
    Lib& l = lib();
    if (!l.create) return nullptr;
    cublasHandle_t h = nullptr;
    if (l.create(&h) != CUBLAS_STATUS_SUCCESS) {
      l.error = "cublasCreate failed";
      return nullptr;
    }
    Gemm* out = new Gemm();  // lives for the process (no cublasDestroy at exit: the driver may be gone)
    out->handle_ = h;
    return out;
  }();
  return g;
}

const std::string& Gemm::load_error() { return lib().error; }

void Gemm::run(k::Elem e, const void* W, const float* x, void* xb, float* y, int M, int N, int K, bool accumulate,
               cudaStream_t s) {
  Lib& l = lib();
  auto h = static_cast<cublasHandle_t>(handle_);
  if (l.set_stream(h, s) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: cublasSetStream failed");
  const void* B = x;
  if (e != k::Elem::F32) {
    k::convert(x, e, xb, int64_t(M) * K, s);
    B = xb;
  }
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Column-major: y^T [N, M] = W [K, N]^T x^T [K, M].
  // fp32 weights: pedantic fp32 (no TF32), so a prefill chunk stays within the fp32 tolerances.
  const cublasComputeType_t ct = e == k::Elem::F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const cublasStatus_t st = l.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, dtype(e), K, B, dtype(e), K,
                                      &beta, y, CUDA_R_32F, N, ct, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: cublasGemmEx failed (status {}) for {}x{}x{}", int(st), M, N, K);
}

}  // namespace ptllm::cuda
