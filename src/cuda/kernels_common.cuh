// Device helpers shared by the CUDA kernel files (kernels.cu: the dense path and
// the plain cache; kivi_kernels.cu: the grouped KIVI cache). Internal to src/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

#include "cuda/kernels.h"

namespace ptllm::cuda::k {

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

// 8 consecutive elements widened (p 16-byte aligned for 2-byte types, 32 for fp32).
template <class T>
__device__ __forceinline__ void load8(const T* p, float* o);
template <>
__device__ __forceinline__ void load8<float>(const float* p, float* o) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
template <>
__device__ __forceinline__ void load8<__half>(const __half* p, float* o) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    o[2 * i] = f.x; o[2 * i + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, float* o) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    o[2 * i] = f.x; o[2 * i + 1] = f.y;
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
template <class A>
__global__ void combine_batch_kernel(const A* as, int S, int hd) {
  const A& a = as[blockIdx.y];
  const float* pp = a.part + int64_t(blockIdx.x) * S * (hd + 2);
  float* out = a.out + int64_t(blockIdx.x) * hd;
  float M = -INFINITY;
  for (int s = 0; s < S; ++s) M = fmaxf(M, pp[s * (hd + 2)]);
  float L = 0;
  for (int s = 0; s < S; ++s)
    if (pp[s * (hd + 2) + 1] > 0) L += pp[s * (hd + 2) + 1] * expf(pp[s * (hd + 2)] - M);
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0;
    for (int s = 0; s < S; ++s) {
      const float* ps = pp + s * (hd + 2);
      if (ps[1] > 0) o += ps[2 + j] * expf(ps[0] - M);
    }
    out[j] = L > 0 ? o / L : 0.f;
  }
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
