// Device helpers shared by the CUDA kernel files (kernels.cu: the dense path and
// the plain cache; kivi_kernels.cu: the grouped KIVI cache). Internal to src/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <type_traits>
#include <utility>

#include "cuda/kernels.h"

namespace ptllm::cuda::k {

// ---- Programmatic dependent launch (PDL, compute capability 9.0+) ----
// Every kernel of kernels.cu and kivi_kernels.cu is launched through launch() below,
// which (pdl_enabled()) lets the GPU start its blocks while the previous kernel of the
// stream still runs, and every kernel calls pdl_enter() in all its threads before it reads
// anything an earlier launch wrote or writes anything: griddepcontrol.wait (the previous
// kernel has finished and its writes are visible), then griddepcontrol.launch_dependents
// (the next kernel may start launching). Only the one-row GEMV kernels (gemv1_kernel,
// gemv1p_kernel) do work before it: the loads of their first weight chunk, which no
// kernel of a step writes (kernels.h, gemv). So a decode step's ~10 launches per layer
// overlap each one's launch latency and the GEMV's first DRAM round trip with the kernel
// before it (docs/CUDA.md, Session 15). Since every thread waits before it exits, a
// kernel's completion implies its predecessor's, and a kernel reading what was written
// two or more launches back sees it too. After a copy or a cuBLAS kernel our kernels
// wait in pdl_enter() all the same, so correctness does not depend on when those let
// their successor start. pdl_enabled() is false (launch() a plain launch, pdl_enter()
// returning at once: no prerequisite grid) with PTLLM_CUDA_PDL=0 (exactly "0") or on a GPU
// below compute capability 9.0. Not handled: kernels compiled only for a virtual
// architecture below compute_90 and JIT-run on a 9.0 GPU would launch this way with an
// empty pdl_enter(); build for the GPU (CMAKE_CUDA_ARCHITECTURES, default 90a) or set
// PTLLM_CUDA_PDL=0. (A cudaFuncGetAttributes ptxVersion check was written for this and
// not kept: it could not be run on the H200 before the session ended.)
bool pdl_enabled();

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, shmem, s>>>(args...), as a programmatic dependent launch where enabled.
// A launch error shows in cudaGetLastError, as for <<<>>>.
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem, cudaStream_t s, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shmem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

// Attention splits: kChunk slots per block (kivi_chunk() for the KIVI kernel),
// kThreads threads, head_dim up to kMaxHd.
constexpr int kChunk = 256, kThreads = 128, kMaxHd = 512;

namespace {

template <class T>
__device__ __forceinline__ float widen(T v);
template <>
__device__ __forceinline__ float widen<float>(float v) { return v; }
template <>
__device__ __forceinline__ float widen<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The 16-byte word u (8 fp16/bf16) widened.
template <class T>
__device__ __forceinline__ void widen8(const uint4& u, float* o) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "2-byte types");
  if constexpr (std::is_same_v<T, __half>) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      o[2 * i] = f.x; o[2 * i + 1] = f.y;
    }
  } else {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      o[2 * i] = f.x; o[2 * i + 1] = f.y;
    }
  }
}

// 8 consecutive elements widened (p 16-byte aligned for 2-byte types, 32 for fp32).
template <class T>
__device__ __forceinline__ void load8(const T* p, float* o) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  } else {
    widen8<T>(*reinterpret_cast<const uint4*>(p), o);
  }
}

// A query q [hd] turned by its two angles (cs [2][hd]: cos | sin for the slots before
// run_split, then for the others; StreamingLLM re-positioning), rotate-half order, into
// qa / qb [hd]; the block's threads share the channel pairs.
__device__ __forceinline__ void rotate_query_runs(const float* q, const float* cs, int hd, float* qa, float* qb) {
  const int half = hd / 2;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float x0 = q[j], x1 = q[j + half];
    qa[j] = x0 * cs[j] - x1 * cs[half + j];
    qa[j + half] = x1 * cs[j] + x0 * cs[half + j];
    qb[j] = x0 * cs[hd + j] - x1 * cs[hd + half + j];
    qb[j + half] = x1 * cs[hd + j] + x0 * cs[hd + half + j];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp's softmax numerator over a chunk's scores p[0, len): p[j] <- exp(p[j] - m).
// m (the max) and l (the sum of the exps) come back on every lane, for the
// cross-chunk merge.
__device__ __forceinline__ void warp_softmax_exp(float* p, int len, int lane, float& m, float& l) {
  m = -INFINITY;
  for (int j = lane; j < len; j += 32) m = fmaxf(m, p[j]);
  m = warp_max(m);
  l = 0;
  for (int j = lane; j < len; j += 32) {
    const float e = expf(p[j] - m);
    p[j] = e;
    l += e;
  }
  l = warp_sum(l);
}

// A batched launch's per-sequence parameter struct, copied to shared memory by the
// block (the structs have default member initializers: no __shared__ object of them).
template <class A>
__device__ __forceinline__ const A& stage_params(const A* src) {
  static_assert(sizeof(A) % 4 == 0, "parameter struct of whole words");
  __shared__ alignas(16) unsigned int raw[sizeof(A) / 4];
  for (int w = threadIdx.x; w < int(sizeof(A) / 4); w += blockDim.x) raw[w] = reinterpret_cast<const unsigned int*>(src)[w];
  __syncthreads();
  return *reinterpret_cast<const A*>(raw);
}

// combine_kernel of a batched launch: block (head, sequence) merges the S split
// partials at as[b].part into as[b].out (A: Attend or AttendKivi).
// Merges one row's S split partials pp [S, hd + 2] (max, sum, o[hd]) into out[hd];
// 128 threads (hd <= kMaxHd = 4 x 128). The max and the splits' weights are spread
// over the threads (weights staged in shared memory, 1,024 splits at a time); each
// channel's sum runs over the splits in order with the loads of 8 splits in flight
// (session 8 measured 32 in flight: one sequence's combine at 32K 33 -> 75 us, so 8 stays).
// A split that saw no slot (sum 0: its o is not written) weighs nothing.
__device__ __forceinline__ float block_reduce_128(float x, bool is_max) {
  __shared__ float red[4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = is_max ? warp_max(x) : warp_sum(x);
  __syncthreads();
  if (lane == 0) red[warp] = x;
  __syncthreads();
  return is_max ? fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3])) : (red[0] + red[1]) + (red[2] + red[3]);
}
__device__ __forceinline__ void combine_row(const float* pp, int S, int hd, float* out) {
  __shared__ float w[1024];
  const int tid = threadIdx.x, st = hd + 2;
  float m = -INFINITY;
  for (int s = tid; s < S; s += 128) m = fmaxf(m, pp[int64_t(s) * st]);
  const float M = block_reduce_128(m, true);
  float l = 0;
  float o[kMaxHd / 128] = {};
  for (int s0 = 0; s0 < S; s0 += 1024) {
    const int n = S - s0 < 1024 ? S - s0 : 1024;
    __syncthreads();  // the previous tile's weights are used up
    for (int s = tid; s < n; s += 128) {
      const float* ps = pp + int64_t(s0 + s) * st;
      const float ws = ps[1] > 0 ? expf(ps[0] - M) : 0.f;
      w[s] = ws;
      if (ps[1] > 0) l += ps[1] * ws;
    }
    __syncthreads();
#pragma unroll
    for (int jj = 0; jj < kMaxHd / 128; ++jj) {
      const int j = tid + jj * 128;
      if (j < hd) {
        float acc = o[jj];
        const float* pj = pp + int64_t(s0) * st + 2 + j;
#pragma unroll 8
        for (int s = 0; s < n; ++s) {
          const float x = pj[int64_t(s) * st], ws = w[s];
          acc = ws > 0 ? fmaf(x, ws, acc) : acc;
        }
        o[jj] = acc;
      }
    }
  }
  const float L = block_reduce_128(l, false);
#pragma unroll
  for (int jj = 0; jj < kMaxHd / 128; ++jj) {
    const int j = tid + jj * 128;
    if (j < hd) out[j] = L > 0 ? o[jj] / L : 0.f;
  }
}

template <class A>
__global__ void __launch_bounds__(128) combine_batch_kernel(const A* as, int S, int hd) {
  pdl_enter();
  const A& a = as[blockIdx.y];
  combine_row(a.part + int64_t(blockIdx.x) * S * (hd + 2), S, hd, a.out + int64_t(blockIdx.x) * hd);
}

}  // namespace

// Blocks for an elementwise kernel over n values (256 threads each, at most 4,096).
int grid_for(int64_t n);
// Slots per split of the KIVI kernel: decode steps (a few queries) use short splits
// so that a GQA block of heads still leaves enough blocks for the whole GPU
// (1B shape at depth 4,096: 64 splits x 8 KV heads); prefill chunks use kChunk.
int kivi_chunk(int n);
// Merges the per-split softmax partials of `rows` (query, head) pairs.
void combine(const float* part, int rows, int S, int hd, float* out, cudaStream_t s);

}  // namespace ptllm::cuda::k
