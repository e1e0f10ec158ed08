// CUDA kernels of the GPU decode path (kernels.cu), behind plain C++
// signatures so the host code (backend.cc) compiles with the C++ compiler.
// All activations are fp32 row-major; weights and cache rows are fp32, fp16
// or bf16 and are widened to fp32 before any arithmetic.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace ptllm::cuda::k {

enum class Elem { F32, F16, BF16 };
inline int elem_bytes(Elem e) { return e == Elem::F32 ? 4 : 2; }

// dst[0..n) = src as `e` (round to nearest even).
void convert(const float* src, Elem e, void* dst, int64_t n, cudaStream_t s);
// x[t, :] = E[ids[t], :] widened; E [vocab, H].
void embed(Elem e, const void* E, const int32_t* ids, int n, int H, float* x, cudaStream_t s);
// out[t] = x[t] / rms(x[t]) * w, x/out [n, H].
void rmsnorm(const float* x, const float* w, float eps, int n, int H, float* out, cudaStream_t s);
// y[m, :] (+)= W x[m, :] + bias for m < M; W [N, K] row-major (an nn.Linear
// weight), x [M, K], y [M, N]. Each weight is read once per 8 rows.
void gemv(Elem e, const void* W, const float* x, const float* bias, float* y, int M, int N, int K, bool accumulate,
          cudaStream_t s);
// gate[i] = silu(gate[i]) * up[i].
void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t s);
// Rotate-half RoPE of x [n, nh, hd] by cs [n, hd] (cos of the hd/2 frequencies, then sin).
void rope(float* x, int n, int nh, int hd, const float* cs, cudaStream_t s);

// One layer's plain K or V cache rows: [kvh, cap, hd] of `e`. Slots: rows
// [0, sink_cap) are the sinks, the others a ring of ring_cap rows from ring_start
// (kv/kv_store.cc's PlainStore layout).
struct PlainLayer {
  void* k = nullptr;
  void* v = nullptr;
  Elem e = Elem::F16;
  int kvh = 0, cap = 0, hd = 0, sink_cap = 0, ring_start = 0, ring_cap = 0;
};
// Stores k, v [n, kvh, hd] (k already rotated) at slots first .. first+n-1.
void append_plain(const PlainLayer& c, const float* k, const float* v, int n, int first, cudaStream_t s);

// Causal attention of n queries over slots [0, len) of one sequence: query i
// is at slot first + i and sees slots <= first + i. q [n, nh, hd] un-rotated;
// qcs [n, 2, hd]: the query's cos/sin for slots < run_split (A) and the rest (B)
// (StreamingLLM re-positioning: sinks and window differ by the evicted count).
// out [n, nh, hd]. part: scratch of attend_scratch_floats(n, nh, hd, len).
struct Attend {
  PlainLayer c;
  const float* q = nullptr;
  const float* qcs = nullptr;
  int n = 0, nh = 0, len = 0, first = 0, run_split = 0;
  float scale = 1;
  float* out = nullptr;
  float* part = nullptr;
};
int64_t attend_scratch_floats(int n, int nh, int hd, int len);
void attend_plain(const Attend& a, cudaStream_t s);

}  // namespace ptllm::cuda::k
