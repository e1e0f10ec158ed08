// CUDA kernels of the GPU decode path: the dense layers and the plain
// (fp32/fp16/bf16) cache; the grouped KIVI cache is in kivi_kernels.cu. Shapes:
// kernels.h.
#include "cuda/kernels_common.cuh"

#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace ptllm::cuda::k {
namespace {

template <class T>
__global__ void convert_kernel(const float* src, T* dst, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = narrow<T>(src[i]);
}

template <class T>
__global__ void embed_kernel(const T* E, const int32_t* ids, int H, float* x) {
  pdl_enter();
  const T* row = E + int64_t(ids[blockIdx.x]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[int64_t(blockIdx.x) * H + i] = widen(row[i]);
}

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int H, float* out) {
  pdl_enter();
  const float* xr = x + int64_t(blockIdx.x) * H;
  float ss = 0;
  for (int i = threadIdx.x; i < H; i += blockDim.x) ss += xr[i] * xr[i];
  __shared__ float red[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  const float inv = float(1.0 / sqrt(double(red[0]) / double(H) + double(eps)));
  float* o = out + int64_t(blockIdx.x) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// The segment of a launch's concatenated output row n; n becomes the row within it.
// Unrolled over kMaxSegs with constant indices and returned by value: indexing the
// kernel parameter by a run-time segment number made every GEMV kernel copy the whole
// GemvSegs to a local-memory stack frame first (ptxas: 104 bytes).
__device__ __forceinline__ GemvOut seg_of(const GemvSegs& segs, int& n) {
  GemvOut r = segs.o[0];
  bool more = true;
#pragma unroll
  for (int i = 1; i < kMaxSegs; ++i) {
    more = more && i < segs.n && n >= r.N;
    if (more) {
      n -= r.N;
      r = segs.o[i];
    }
  }
  return r;
}

// Output row n of segment o from its sums v (kGlu: v[0] the gate's, v[1] the up's).
template <bool kGlu>
__device__ __forceinline__ void gemv_store(const GemvOut& o, int n, float* v) {
  float* yo = o.y + n;
  if (kGlu) {
    *yo = v[0] / (1.f + expf(-v[0])) * v[1];  // silu_mul_kernel's arithmetic
  } else {
    if (o.bias) v[0] += o.bias[n];
    *yo = o.accumulate ? *yo + v[0] : v[0];
  }
}

// wpr warps per output row n (wpr in 1, 2, 4, 8: several when N is small, so
// that a short projection still fills the GPU), up to 8 input rows: the weight
// row is streamed once (16-byte loads), each warp a strided share of K, and
// multiplied with every input row; partial sums meet in shared memory.
// The output rows of one launch are the concatenation of up to kMaxSegs
// projections that share x (q, k and v: one launch instead of three; each row
// n's sum is the same whichever segments share the launch). kGlu: segment 0
// is the gate and segment 1 the up projection of the same N rows, both read
// by the same warps, and y = silu(gate) * up (SwiGLU in the epilogue: one
// launch instead of gate, up and silu_mul).
constexpr int kRows = 8, kWarps = 8;
template <class T, bool kVec, bool kGlu>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvSegs segs, const float* __restrict__ x, int M, int K,
                                                           int wpr) {
  pdl_enter();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int part = warp % wpr;
  int n = blockIdx.x * (kWarps / wpr) + warp / wpr;
  const GemvOut o = seg_of(segs, n);
  constexpr int kAcc = kGlu ? 2 : 1;
  __shared__ float red[kAcc][kWarps][kRows];
  float acc[kAcc][kRows] = {};
  if (n < o.N) {
    const T* w[kAcc];
    w[0] = static_cast<const T*>(o.W) + int64_t(n) * K;
    if (kGlu) w[kAcc - 1] = static_cast<const T*>(segs.o[1].W) + int64_t(n) * K;
    if (kVec) {
      for (int k0 = (part * 32 + lane) * 8; k0 < K; k0 += wpr * 32 * 8) {
        float wv[kAcc][8];
#pragma unroll
        for (int a = 0; a < kAcc; ++a) load8(w[a] + k0, wv[a]);
#pragma unroll
        for (int m = 0; m < kRows; ++m) {
          if (m < M) {
            float xv[8];
            load8(x + int64_t(m) * K + k0, xv);
#pragma unroll
            for (int a = 0; a < kAcc; ++a)
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[a][m] = fmaf(wv[a][j], xv[j], acc[a][m]);
          }
        }
      }
    } else {
      for (int kk = part * 32 + lane; kk < K; kk += wpr * 32) {
        float wv[kAcc];
#pragma unroll
        for (int a = 0; a < kAcc; ++a) wv[a] = widen(w[a][kk]);
#pragma unroll
        for (int m = 0; m < kRows; ++m)
          if (m < M)
#pragma unroll
            for (int a = 0; a < kAcc; ++a) acc[a][m] = fmaf(wv[a], x[int64_t(m) * K + kk], acc[a][m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    if (m < M) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a) {
        const float v = warp_sum(acc[a][m]);
        if (lane == 0) red[a][warp][m] = v;
      }
    }
  }
  __syncthreads();
  if (n < o.N && part == 0 && lane < M) {
    const int m = lane;
    float v[2];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      v[a] = 0;
      for (int p = 0; p < wpr; ++p) v[a] += red[a][warp + p][m];
    }
    GemvOut om = o;  // input row m's outputs
    om.y += int64_t(m) * o.N;
    gemv_store<kGlu>(om, n, v);
  }
}

// The batch-invariant mode's product (GemvSegs::rows_alike, K % 8 == 0): up to kTileM input
// rows per launch, each warp kTileN weight rows (kGlu: kTileN / 2 output rows, their gate and
// up rows), wpr warps splitting K as gemv_kernel does. Each output (m, n) is the same chain
// of FMAs whatever M is and whichever rows share the launch: lane l of part p takes the
// 8-element words k0 = (p * 32 + l) * 8 + i * wpr * 256 in order, then the fixed butterfly
// warp_sum, then the wpr partial sums in part order; wpr depends on N and K only. Against
// gemv_kernel it reads each weight word once per 16 input rows instead of 8 and each input
// word once per 4 weight rows instead of 1 (gemv_kernel from 16 rows on was ~13x slower than
// the GEMM: docs/CUDA.md, "Session 29"). The mode's default since session 31 (H100: the same
// bits alone and among 4 or 20, within the fp16 cache's bound of the CPU; 6-10% faster than
// gemv_kernel from 16 rows, 3.5% slower alone): invariant_tile() below.
constexpr int kTileM = 16, kTileN = 4;
template <class T, bool kGlu>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_tile_kernel(GemvSegs segs, const float* __restrict__ x, int M,
                                                                int K, int wpr) {
  pdl_enter();
  constexpr int kOut = kGlu ? kTileN / 2 : kTileN;  // output rows per warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int part = warp % wpr;
  const int n0 = (blockIdx.x * (kWarps / wpr) + warp / wpr) * kOut;
  __shared__ float red[kTileN][kWarps][kTileM];
  // Weight row r of this warp: plain, output row n0 + r of its segment; kGlu, r < kOut the
  // gate and r >= kOut the up row of output row n0 + r % kOut.
  // (The segments are looked up again for the stores: held across the loop they cost ~60
  // registers.)
  const T* w[kTileN];
#pragma unroll
  for (int r = 0; r < kOut; ++r) {
    int n = n0 + r;
    const GemvOut o = seg_of(segs, n);
    const int row = n < o.N ? n : 0;  // a row past the end reads row 0 and stores nothing
    w[r] = static_cast<const T*>(o.W) + int64_t(row) * K;
    if (kGlu) w[r + kOut] = static_cast<const T*>(segs.o[1].W) + int64_t(row) * K;
  }
  float acc[kTileM][kTileN] = {};
  for (int k0 = (part * 32 + lane) * 8; k0 < K; k0 += wpr * 32 * 8) {
    float wv[kTileN][8];
#pragma unroll
    for (int r = 0; r < kTileN; ++r) load8(w[r] + k0, wv[r]);
#pragma unroll
    for (int m = 0; m < kTileM; ++m) {
      if (m < M) {
        float xv[8];
        load8(x + int64_t(m) * K + k0, xv);
#pragma unroll
        for (int r = 0; r < kTileN; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(wv[r][j], xv[j], acc[m][r]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kTileM; ++m) {
    if (m < M) {
#pragma unroll
      for (int r = 0; r < kTileN; ++r) {
        const float v = warp_sum(acc[m][r]);
        if (lane == 0) red[r][warp][m] = v;
      }
    }
  }
  __syncthreads();
  if (part == 0 && lane < M) {
    const int m = lane;
#pragma unroll
    for (int r = 0; r < kOut; ++r) {
      int n = n0 + r;
      GemvOut om = seg_of(segs, n);
      if (n >= om.N) continue;
      float v[2] = {0.f, 0.f};
      for (int p = 0; p < wpr; ++p) v[0] += red[r][warp + p][m];
      if (kGlu)
        for (int p = 0; p < wpr; ++p) v[1] += red[r + kOut][warp + p][m];
      om.y += int64_t(m) * om.N;  // input row m's outputs
      gemv_store<kGlu>(om, n, v);
    }
  }
}

// One chunk of kU 16-byte words per lane (words v0 + 32u + lane of a weight row, in raw)
// into acc: 8-element FMA chains per word in order, x widened from fp32 pairs of float4
// (kNorm: times the norm weight's gv, the same words of it).
template <class T, int kAcc, int kU, bool kNorm>
__device__ __forceinline__ void gemv_chunk(const uint4 (*raw)[kU], const float4* __restrict__ xv,
                                           const float4* __restrict__ gv, int v0, int nv, float* acc) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int v = v0 + u * 32 + lane;
    if (v < nv) {
      float4 x0 = __ldg(xv + 2 * v), x1 = __ldg(xv + 2 * v + 1);
      if (kNorm) {
        const float4 g0 = __ldg(gv + 2 * v), g1 = __ldg(gv + 2 * v + 1);
        x0 = make_float4(x0.x * g0.x, x0.y * g0.y, x0.z * g0.z, x0.w * g0.w);
        x1 = make_float4(x1.x * g1.x, x1.y * g1.y, x1.z * g1.z, x1.w * g1.w);
      }
      const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int a = 0; a < kAcc; ++a) {
        float f[8];
        widen8<T>(raw[a][u], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[a] = fmaf(f[j], xs[j], acc[a]);
      }
    }
  }
}

// 1 / rms of the row x [K] (nv = K / 8 float4 pairs), summed by the calling warp alone (lane-
// strided pairs in order, then the butterfly: the same value in every warp that calls it),
// the final step in double as rmsnorm_kernel's. x was written by the previous launch: after
// pdl_enter(). The row is 8-32 KB, read from L2 by every warp of an SM and then from L1,
// while the warp's first weight chunk is in flight.
__device__ __forceinline__ float warp_inv_rms(const float4* __restrict__ xv, int nv, int K, float eps) {
  float ss = 0;
  for (int v = threadIdx.x & 31; v < nv; v += 32) {
    const float4 a = __ldg(xv + 2 * v), b = __ldg(xv + 2 * v + 1);
    ss = fmaf(a.x, a.x, ss), ss = fmaf(a.y, a.y, ss), ss = fmaf(a.z, a.z, ss), ss = fmaf(a.w, a.w, ss);
    ss = fmaf(b.x, b.x, ss), ss = fmaf(b.y, b.y, ss), ss = fmaf(b.z, b.z, ss), ss = fmaf(b.w, b.w, ss);
  }
  ss = warp_sum(ss);
  return float(1.0 / sqrt(double(ss) / double(K) + double(eps)));
}

// Warp `warp` of `warps` (the launch's) issues its share of pf's ranges as one bulk L2
// prefetch per range from lane 0: contiguous shares of a multiple of 16 bytes, in warp
// order. Called by every warp once it has no row left (GemvPrefetch, kernels.h).
__device__ __forceinline__ void prefetch_share(const GemvPrefetch& pf, int warp, int warps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t bytes = pf.bytes[r];
    if (bytes <= 0) continue;
    const int64_t share = ((bytes + warps - 1) / warps + 15) & ~int64_t(15);
    const int64_t a = share * warp;
    if (a >= bytes) continue;
    const uint32_t len = uint32_t(bytes - a < share ? bytes - a : share);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(pf.p[r]) + a), "r"(len)
                 : "memory");
  }
#endif
}

// One input row (a decode step) with 2-byte weights: a warp per output row, each
// lane kU 16-byte weight loads issued before their multiply-adds (kU x 512 bytes of
// a row in flight per warp), x read through the read-only cache, one warp reduction
// and no shared memory or block barrier. The kernel above keeps K split over up to
// 8 warps with a barrier per block and one load in flight per lane, and reached
// ~30% of the H200's bandwidth on the 1B shape (docs/CUDA.md, Session 13). Segments
// and kGlu as above; per row the sum is lane-strided 8-element chunks in order,
// then the warp's butterfly, whichever segments share the launch. kNorm: x is the
// un-normalised row and segs.norm's weight multiplies it; each row's sum is then
// scaled by warp_inv_rms (GemvNorm, kernels.h).
constexpr int kRowsPerBlock1 = 4;
template <class T, bool kGlu, bool kNorm>
__global__ void __launch_bounds__(kRowsPerBlock1 * 32) gemv1_kernel(GemvSegs segs, const float* __restrict__ x, int K) {
  constexpr int kU = 8;
  constexpr int kAcc = kGlu ? 2 : 1;
  const int lane = threadIdx.x & 31;
  int n = blockIdx.x * kRowsPerBlock1 + (threadIdx.x >> 5);
  const GemvOut o = seg_of(segs, n);
  const bool live = n < o.N;
  const uint4* w[kAcc];
  w[0] = reinterpret_cast<const uint4*>(static_cast<const T*>(o.W) + int64_t(live ? n : 0) * K);
  if (kGlu) w[kAcc - 1] = reinterpret_cast<const uint4*>(static_cast<const T*>(segs.o[1].W) + int64_t(live ? n : 0) * K);
  const float4* xv = reinterpret_cast<const float4*>(x);
  const int nv = K / 8;  // 16-byte words per weight row
  float acc[kAcc] = {};
  uint4 raw[kAcc][kU];
  const auto load = [&](int v0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = v0 + u * 32 + lane;
#pragma unroll
      for (int a = 0; a < kAcc; ++a) raw[a][u] = live && v < nv ? __ldcs(w[a] + v) : make_uint4(0, 0, 0, 0);
    }
  };
  // The weights are no launch's output: their first chunk (a whole row at K <= 2,048) is
  // read while the previous kernel finishes; x and y only after it. Holding the chunk across
  // the wait keeps all kU loads in flight (62 registers for one segment, 32 before, when the
  // compiler interleaved loads and multiply-adds): 587-592 -> 632-635 tok/s on the 1B shape
  // without PDL, 724-726 with it (docs/CUDA.md, Session 15).
  load(0);
  pdl_enter();
  const int warp_id = blockIdx.x * kRowsPerBlock1 + (threadIdx.x >> 5), warps = gridDim.x * kRowsPerBlock1;
  if (!live) return prefetch_share(segs.next, warp_id, warps);
  const float4* gv = reinterpret_cast<const float4*>(segs.norm.w);
  const float inv = kNorm ? warp_inv_rms(xv, nv, K, segs.norm.eps) : 1.f;
  for (int v0 = 0; v0 < nv; v0 += 32 * kU) {
    if (v0 > 0) load(v0);
    gemv_chunk<T, kAcc, kU, kNorm>(raw, xv, gv, v0, nv, acc);
  }
  float v[2];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) v[a] = kNorm ? warp_sum(acc[a]) * inv : warp_sum(acc[a]);
  if (lane == 0) gemv_store<kGlu>(o, n, v);
  prefetch_share(segs.next, warp_id, warps);
}

// gemv1_kernel with a warp walking rows n, n + W, ... (W = the grid's warps, a few
// blocks per SM) in chunks of kU words per lane, the next chunk's loads issued before
// the current one's multiply-adds, so a warp's loads stay in flight across rows (in
// gemv1_kernel every warp waits for its one row at the same time as the others of its
// wave). Each row's sum is gemv1_kernel's: the same chunks in the same order per lane,
// then the warp's butterfly (bit-identical; FusedGemvMatchesSeparateLaunches), at any kU
// (words per lane per chunk: a lane's words are v = lane, lane + 32, ... in order either
// way). kU 4 holds half the registers of 8 (the kGlu kernel: two rows' chunks, current and
// next), so more blocks stay resident, with half the bytes in flight per warp.
template <class T, bool kGlu, bool kNorm, int kU>
__global__ void __launch_bounds__(kRowsPerBlock1 * 32) gemv1p_kernel(GemvSegs segs, const float* __restrict__ x,
                                                                    int K, int N) {
  constexpr int kAcc = kGlu ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int stride = gridDim.x * kRowsPerBlock1;
  const int nv = K / 8;
  const float4* xv = reinterpret_cast<const float4*>(x);
  // Row n (of the launch's concatenated segments) -> its weight rows.
  const auto rows = [&](int n, const uint4** w) {
    const GemvOut o = seg_of(segs, n);  // n becomes the row within o (before it is read below)
    w[0] = reinterpret_cast<const uint4*>(static_cast<const T*>(o.W) + int64_t(n) * K);
    if (kGlu) w[kAcc - 1] = reinterpret_cast<const uint4*>(static_cast<const T*>(segs.o[1].W) + int64_t(n) * K);
  };
  const auto load = [&](const uint4* const* w, int v0, uint4 (*raw)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = v0 + u * 32 + lane;
#pragma unroll
      for (int a = 0; a < kAcc; ++a) raw[a][u] = v < nv ? __ldcs(w[a] + v) : make_uint4(0, 0, 0, 0);
    }
  };
  int n = blockIdx.x * kRowsPerBlock1 + (threadIdx.x >> 5), v0 = 0;
  const uint4* w[kAcc];
  uint4 cur[kAcc][kU], next[kAcc][kU];
  if (n < N) {
    rows(n, w);
    load(w, 0, cur);  // weights only before the wait, as in gemv1_kernel
  }
  pdl_enter();
  const int warp_id = n, warps = stride;  // (n: the warp's first row, blockIdx.x * 4 + warp)
  if (n >= N) return prefetch_share(segs.next, warp_id, warps);
  const float4* gv = reinterpret_cast<const float4*>(segs.norm.w);
  const float inv = kNorm ? warp_inv_rms(xv, nv, K, segs.norm.eps) : 1.f;
  float acc[kAcc] = {};
  while (n < N) {
    // The next chunk: the rest of this row, else the warp's next row.
    int nn = n, nv0 = v0 + 32 * kU;
    const uint4* wn[kAcc];
#pragma unroll
    for (int a = 0; a < kAcc; ++a) wn[a] = w[a];
    if (nv0 >= nv) {
      nn = n + stride;
      nv0 = 0;
      if (nn < N) rows(nn, wn);
    }
    if (nn < N) load(wn, nv0, next);
    gemv_chunk<T, kAcc, kU, kNorm>(cur, xv, gv, v0, nv, acc);
    if (nn != n) {  // row n is complete
      float v[2];
#pragma unroll
      for (int a = 0; a < kAcc; ++a) {
        v[a] = kNorm ? warp_sum(acc[a]) * inv : warp_sum(acc[a]);
        acc[a] = 0;
      }
      if (lane == 0) {
        int r = n;
        const GemvOut o = seg_of(segs, r);
        gemv_store<kGlu>(o, r, v);
      }
    }
#pragma unroll
    for (int a = 0; a < kAcc; ++a) {
      w[a] = wn[a];
#pragma unroll
      for (int u = 0; u < kU; ++u) cur[a][u] = next[a][u];
    }
    n = nn;
    v0 = nv0;
  }
  prefetch_share(segs.next, warp_id, warps);
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = g[i];
    g[i] = a / (1.f + expf(-a)) * u[i];
  }
}

__global__ void rope_kernel(float* x, int nh, int hd, const float* cs) {
  pdl_enter();
  const int t = blockIdx.x, half = hd / 2;
  const float* c = cs + int64_t(t) * hd;
  for (int j = threadIdx.x; j < nh * half; j += blockDim.x) {
    const int h = j / half, i = j % half;
    float* v = x + (int64_t(t) * nh + h) * hd;
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] - b * c[half + i];
    v[i + half] = b * c[i] + a * c[half + i];
  }
}

__device__ __forceinline__ int64_t phys_row(const PlainLayer& c, int slot) {
  if (slot < c.sink_cap) return slot;
  int r = c.ring_start + (slot - c.sink_cap);
  if (r >= c.ring_cap) r -= c.ring_cap;
  return c.sink_cap + r;
}

template <class T>
__global__ void append_kernel(PlainLayer c, const float* k, const float* v, int first, const float* kcs) {
  pdl_enter();
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t row = (int64_t(h) * c.cap + phys_row(c, first + t)) * c.hd;
  const float* ks = k + (int64_t(t) * c.kvh + h) * c.hd;
  const float* vs = v + (int64_t(t) * c.kvh + h) * c.hd;
  T* kd = static_cast<T*>(c.k) + row;
  T* vd = static_cast<T*>(c.v) + row;
  for (int i = threadIdx.x; i < c.hd; i += blockDim.x) vd[i] = narrow<T>(vs[i]);
  if (!kcs) {
    for (int i = threadIdx.x; i < c.hd; i += blockDim.x) kd[i] = narrow<T>(ks[i]);
    return;
  }
  // rope_kernel's pair rotation, written as it is there.
  const int half = c.hd / 2;
  const float* cs = kcs + int64_t(t) * c.hd;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = ks[i], b = ks[i + half];
    kd[i] = narrow<T>(a * cs[i] - b * cs[half + i]);
    kd[i + half] = narrow<T>(b * cs[i] + a * cs[half + i]);
  }
}

// Flash-decoding split: block (split s, head h, query i) covers kChunk slots;
// 4 warps score 4 slots each at a time (lanes over channels), softmax within
// the chunk, then the weighted V sum (threads over channels). Partials
// (max, sum, o[hd]) go to `part`; combine_kernel merges the splits.
template <class T>
__device__ __forceinline__ void attend_body(const Attend& a, int i) {
  const int s = blockIdx.x, h = blockIdx.y;
  const PlainLayer& c = a.c;
  const int hd = c.hd, kvh = h / (a.nh / c.kvh);
  const int S = gridDim.x;
  __shared__ float qa[kMaxHd], qb[kMaxHd], p[kChunk];
  __shared__ float red[2];
  const float* q = a.q + (int64_t(i) * a.nh + h) * hd;
  const float* cs = a.qcs + int64_t(i) * 2 * hd;
  rotate_query_runs(q, cs, hd, qa, qb);
  __syncthreads();
  const int li = a.first + i + 1;  // slots this query sees
  const int b0 = s * kChunk, b1 = min(b0 + kChunk, li);
  float* part = a.part + ((int64_t(i) * a.nh + h) * S + s) * (hd + 2);
  float* out = a.out + (int64_t(i) * a.nh + h) * hd;  // written here when S == 1
  if (b0 >= b1) {
    if (S == 1)
      for (int j = threadIdx.x; j < hd; j += blockDim.x) out[j] = 0.f;
    else if (threadIdx.x == 0) { part[0] = -INFINITY; part[1] = 0; }
    return;
  }
  const T* K = static_cast<const T*>(c.k) + int64_t(kvh) * c.cap * hd;
  const T* V = static_cast<const T*>(c.v) + int64_t(kvh) * c.cap * hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // A warp scores kU slots together (their loads in flight at once; each slot's
  // sum in the same order as one at a time). Slots past b1 repeat the last one.
  constexpr int kU = 4;
  for (int t0 = b0 + warp * kU; t0 < b1; t0 += (kThreads / 32) * kU) {
    const T* kr[kU];
    const float* qq[kU];
    float d[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int t = min(t0 + u, b1 - 1);
      kr[u] = K + phys_row(c, t) * hd;
      qq[u] = t < a.run_split ? qa : qb;
      d[u] = 0;
    }
    for (int j = lane; j < hd; j += 32) {
      float kv[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) kv[u] = widen(kr[u][j]);
#pragma unroll
      for (int u = 0; u < kU; ++u) d[u] = fmaf(qq[u][j], kv[u], d[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const float v = warp_sum(d[u]);
      if (lane == 0 && t0 + u < b1) p[t0 + u - b0] = v * a.scale;
    }
  }
  __syncthreads();
  const int len = b1 - b0;
  if (warp == 0) {
    float m, l;
    warp_softmax_exp(p, len, lane, m, l);
    if (lane == 0) { red[0] = m; red[1] = l; }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0;
    int t = 0;
    for (; t + 8 <= len; t += 8) {  // 8 rows' loads in flight, then the sums in order
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = widen(V[phys_row(c, b0 + t + u) * hd + j]);
#pragma unroll
      for (int u = 0; u < 8; ++u) o = fmaf(p[t + u], v[u], o);
    }
    for (; t < len; ++t) o = fmaf(p[t], widen(V[phys_row(c, b0 + t) * hd + j]), o);
    // One split: the combine's result (its weight exp(m - m) is 1) written
    // here, and the combine is not launched (attend_plain*).
    if (S == 1)
      out[j] = red[1] > 0 ? o / red[1] : 0.f;
    else
      part[2 + j] = o;
  }
  if (threadIdx.x == 0 && S > 1) { part[0] = red[0]; part[1] = red[1]; }
}

template <class T>
__global__ void __launch_bounds__(kThreads) attend_kernel(Attend a) {
  pdl_enter();
  attend_body<T>(a, blockIdx.z);
}

// Batched decode: block (split, head, sequence); the sequence's parameters are staged in shared memory.
template <class T>
__global__ void __launch_bounds__(kThreads) attend_batch_kernel(const Attend* as) {
  pdl_enter();
  const Attend& a = stage_params(as + blockIdx.z);
  attend_body<T>(a, 0);
}

template <class T>
__global__ void append_batch_kernel(const AppendPlainB* ps) {
  pdl_enter();
  const AppendPlainB& p = ps[blockIdx.x];
  const PlainLayer& c = p.c;
  const int h = blockIdx.y;
  const int64_t row = (int64_t(h) * c.cap + phys_row(c, p.first)) * c.hd;
  T* kd = static_cast<T*>(c.k) + row;
  T* vd = static_cast<T*>(c.v) + row;
  const float* ks = p.k + h * c.hd;
  for (int i = threadIdx.x; i < c.hd; i += blockDim.x) vd[i] = narrow<T>(p.v[h * c.hd + i]);
  if (!p.kcs) {
    for (int i = threadIdx.x; i < c.hd; i += blockDim.x) kd[i] = narrow<T>(ks[i]);
    return;
  }
  // append_kernel's rotation (rope_kernel's pair arithmetic).
  const int half = c.hd / 2;
  const float* cs = p.kcs;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float a = ks[i], b = ks[i + half];
    kd[i] = narrow<T>(a * cs[i] - b * cs[half + i]);
    kd[i + half] = narrow<T>(b * cs[i] + a * cs[half + i]);
  }
}

__global__ void __launch_bounds__(128) combine_kernel(const float* part, int S, int hd, float* out) {
  pdl_enter();
  const int64_t qh = blockIdx.x;  // query * nh + head
  combine_row(part + qh * S * (hd + 2), S, hd, out + qh * hd);
}

}  // namespace

bool pdl_enabled() {
  // PTLLM_CUDA_PDL=0: plain launches (each kernel waits for the previous one to finish).
  static const bool on = [] {
    const char* v = std::getenv("PTLLM_CUDA_PDL");
    if (v && v[0] == '0' && v[1] == 0) return false;
    int d = 0, major = 0;
    return cudaGetDevice(&d) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess && major >= 9;
  }();
  return on;
}

int grid_for(int64_t n) { return int((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

// Slots per split of the general KIVI kernel: a few queries (decode too, when the
// decode kernels do not take the shape: kivi_dec_plan) use short splits so that a GQA
// block of heads still leaves enough blocks for the whole GPU; prefill chunks use kChunk.
int kivi_chunk(int n) { return n <= 8 ? 64 : kChunk; }

void combine(const float* part, int rows, int S, int hd, float* out, cudaStream_t s) {
  launch(combine_kernel, rows, 128, 0, s, part, S, hd, out);
}

void convert(const float* src, Elem e, void* dst, int64_t n, cudaStream_t s) {
  const int g = grid_for(n) > 0 ? grid_for(n) : 1;
  if (e == Elem::F32) launch(convert_kernel<float>, g, 256, 0, s, src, static_cast<float*>(dst), n);
  if (e == Elem::F16) launch(convert_kernel<__half>, g, 256, 0, s, src, static_cast<__half*>(dst), n);
  if (e == Elem::BF16) launch(convert_kernel<__nv_bfloat16>, g, 256, 0, s, src, static_cast<__nv_bfloat16*>(dst), n);
}

void embed(Elem e, const void* E, const int32_t* ids, int n, int H, float* x, cudaStream_t s) {
  if (e == Elem::F32) launch(embed_kernel<float>, n, 256, 0, s, static_cast<const float*>(E), ids, H, x);
  if (e == Elem::F16) launch(embed_kernel<__half>, n, 256, 0, s, static_cast<const __half*>(E), ids, H, x);
  if (e == Elem::BF16) launch(embed_kernel<__nv_bfloat16>, n, 256, 0, s, static_cast<const __nv_bfloat16*>(E), ids, H, x);
}

void rmsnorm(const float* x, const float* w, float eps, int n, int H, float* out, cudaStream_t s) {
  // Wide rows take 1,024 threads: a decode step's norm is one block, and its time is
  // the chain of loads per thread (8 at H = 2,048 with 256 threads; ncu: 8.3 us).
  launch(rmsnorm_kernel, n, H >= 2048 ? 1024 : 256, 0, s, x, w, eps, H, out);
}

// Blocks of `threads` of `kernel` that stay resident on one SM at once (4 if the runtime
// cannot tell).
template <class Kernel>
static int resident_blocks(Kernel kernel, int threads) {
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, 0) != cudaSuccess || b < 1) return 4;
  return b;
}

// PTLLM_CUDA_GEMV1=0: one row takes the kernel above too (before session 13); =1 gemv1_kernel
// (a warp per row); =2 gemv1p_kernel (warps walking rows, loads a chunk ahead); =3, the
// default: gemv1_kernel when every row has a resident warp of its own, gemv1p_kernel for
// more rows (the 1B shape on the H200: 587-592 tok/s against 570-579 with =2 and 542-554
// with =1, alternated in one call; docs/CUDA.md, Session 13).
static int gemv1_mode() {
  static const int m = [] {
    const char* v = std::getenv("PTLLM_CUDA_GEMV1");
    return v && v[0] >= '0' && v[0] <= '3' && v[1] == 0 ? v[0] - '0' : 3;
  }();
  return m;
}

// PTLLM_CUDA_GLU_U=4: the row-walking SwiGLU kernel loads 4 words per lane per chunk instead
// of 8 (fewer registers, more resident blocks; the same sums). 8 until measured on the GPU.
static int glu_words() {
  static const int u = [] {
    const char* v = std::getenv("PTLLM_CUDA_GLU_U");
    return v && v[0] == '4' && v[1] == 0 ? 4 : 8;
  }();
  return u;
}

// The batch-invariant mode's products take gemv_tile_kernel (PTLLM_CUDA_INVARIANT_TILE=0:
// gemv_kernel, as before session 31; each gives a row the same sums at every M, but not the
// same as the other: the two split K by different rules for the SwiGLU launch). Measured in
// session 31 (docs/CUDA.md, scripts/cuda_invariant_device.sh).
static bool invariant_tile() {
  static const bool on = [] {
    const char* v = std::getenv("PTLLM_CUDA_INVARIANT_TILE");
    return !(v && v[0] == '0' && v[1] == 0);
  }();
  return on;
}

static int sm_count() {
  static const int n = [] {
    int d = 0, c = 0;
    if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, d) != cudaSuccess)
      return 132;
    return c;
  }();
  return n;
}

// The one-row kernels take a launch: one row of 2-byte weights, K a whole number of 16-byte
// words and x (and a folded norm's weight) 16-byte aligned for float4 loads (the workspace
// rows and device buffers are, at K % 8 == 0).
static bool one_row(bool two_byte, int M, int K, const float* x, const float* norm_w) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return two_byte && gemv1_mode() != 0 && M == 1 && K % 8 == 0 && aligned(x) && aligned(norm_w);
}

bool gemv_folds_norm(Elem e, int M, int K, const float* x) { return one_row(e != Elem::F32, M, K, x, nullptr); }

template <class T, bool kGlu, bool kNorm, int kU>
static void gemv1p_launch(const GemvSegs& segs, const float* x, int K, int N, int blocks, cudaStream_t s) {
  // As many blocks as stay resident at once (registers decide: the kGlu kernel holds
  // two rows' chunks twice), so that every warp walks its rows from the start.
  static const int per_sm = resident_blocks(gemv1p_kernel<T, kGlu, kNorm, kU>, kRowsPerBlock1 * 32);
  const int cap = per_sm * sm_count();
  launch(gemv1p_kernel<T, kGlu, kNorm, kU>, blocks < cap ? blocks : cap, kRowsPerBlock1 * 32, 0, s, segs, x, K, N);
}

template <class T, bool kGlu, bool kNorm>
static void gemv1_launch(const GemvSegs& segs, const float* x, int K, int N, cudaStream_t s) {
  const int blocks = (N + kRowsPerBlock1 - 1) / kRowsPerBlock1;
  const int mode = gemv1_mode();
  static const int per_sm1 = resident_blocks(gemv1_kernel<T, kGlu, kNorm>, kRowsPerBlock1 * 32);
  if (mode == 1 || (mode == 3 && blocks <= per_sm1 * sm_count())) {
    launch(gemv1_kernel<T, kGlu, kNorm>, blocks, kRowsPerBlock1 * 32, 0, s, segs, x, K);
    return;
  }
  if constexpr (kGlu) {
    if (glu_words() == 4) return gemv1p_launch<T, kGlu, kNorm, 4>(segs, x, K, N, blocks, s);
  }
  gemv1p_launch<T, kGlu, kNorm, 8>(segs, x, K, N, blocks, s);
}

template <class T, bool kGlu>
static void gemv_t(GemvSegs segs, const float* x, int M, int K, cudaStream_t s) {
  int N = 0;
  for (int i = 0; i < segs.n; ++i) N += segs.o[i].N;
  if constexpr (!std::is_same_v<T, float>) {
    if (!segs.rows_alike && one_row(true, M, K, x, segs.norm.w)) {
      for (int r = 0; r < 2; ++r) {  // the bulk prefetch's operands: 16-byte aligned, whole 16-byte units
        const bool ok = reinterpret_cast<uintptr_t>(segs.next.p[r]) % 16 == 0 && segs.next.bytes[r] % 16 == 0 &&
                        segs.next.bytes[r] > 0 && segs.next.bytes[r] < (int64_t(1) << 32);  // a share's u32 size
        if (!ok) segs.next.p[r] = nullptr, segs.next.bytes[r] = 0;
      }
      if (segs.norm.w)
        gemv1_launch<T, kGlu, true>(segs, x, K, N, s);
      else
        gemv1_launch<T, kGlu, false>(segs, x, K, N, s);
      return;
    }
  }
  segs.next = GemvPrefetch{};  // only the one-row kernels prefetch
  if (segs.norm.w) {  // not folded: normalise into the scratch rows first
    rmsnorm(x, segs.norm.w, segs.norm.eps, M, K, segs.norm.scratch, s);
    x = segs.norm.scratch;
    segs.norm = GemvNorm{};
  }
  if (segs.rows_alike && K % 8 == 0 && invariant_tile()) {  // gemv_tile_kernel above
    constexpr int kOut = kGlu ? kTileN / 2 : kTileN;
    int wpr = 1;  // N and K only: a row's sums must not depend on M
    while (wpr < kWarps && int64_t(N) / kOut * wpr < 4096 && K >= wpr * 2 * 256) wpr *= 2;
    const int rows_per_block = kWarps / wpr * kOut;
    const dim3 grid((N + rows_per_block - 1) / rows_per_block);
    for (int m0 = 0; m0 < M; m0 += kTileM) {
      const int m = M - m0 < kTileM ? M - m0 : kTileM;
      GemvSegs at = segs;
      for (int i = 0; i < at.n; ++i) at.o[i].y += int64_t(m0) * at.o[i].N;
      launch(gemv_tile_kernel<T, kGlu>, grid, kWarps * 32, 0, s, at, x + int64_t(m0) * K, m, K, wpr);
    }
    return;
  }
  // Enough warps for the whole GPU (~132 SMs x 64 warps): split K over up to 8 warps per row.
  int wpr = 1;
  while (wpr < kWarps && int64_t(N) * wpr < 16384 && K >= wpr * 2 * 256) wpr *= 2;
  const int rows_per_block = kWarps / wpr;
  const dim3 grid((N + rows_per_block - 1) / rows_per_block);
  for (int m0 = 0; m0 < M; m0 += kRows) {
    const int m = M - m0 < kRows ? M - m0 : kRows;
    GemvSegs at = segs;  // the outputs of rows m0..
    for (int i = 0; i < at.n; ++i) at.o[i].y += int64_t(m0) * at.o[i].N;
    if (K % 8 == 0)
      launch(gemv_kernel<T, true, kGlu>, grid, kWarps * 32, 0, s, at, x + int64_t(m0) * K, m, K, wpr);
    else
      launch(gemv_kernel<T, false, kGlu>, grid, kWarps * 32, 0, s, at, x + int64_t(m0) * K, m, K, wpr);
  }
}

template <bool kGlu>
static void gemv_e(Elem e, const GemvSegs& segs, const float* x, int M, int K, cudaStream_t s) {
  if (e == Elem::F32) gemv_t<float, kGlu>(segs, x, M, K, s);
  if (e == Elem::F16) gemv_t<__half, kGlu>(segs, x, M, K, s);
  if (e == Elem::BF16) gemv_t<__nv_bfloat16, kGlu>(segs, x, M, K, s);
}

void gemv(Elem e, const void* W, const float* x, const float* bias, float* y, int M, int N, int K, bool acc,
          cudaStream_t s, const GemvPrefetch* next, bool rows_alike) {
  GemvSegs segs;
  segs.o[0] = GemvOut{W, bias, y, N, acc};
  segs.n = 1;
  segs.rows_alike = rows_alike;
  if (next) segs.next = *next;
  gemv_e<false>(e, segs, x, M, K, s);
}

void gemv_multi(Elem e, const GemvSegs& segs, const float* x, int M, int K, cudaStream_t s) {
  gemv_e<false>(e, segs, x, M, K, s);
}

void gemv_normed(Elem e, const void* W, const float* x, const GemvNorm& norm, float* y, int M, int N, int K,
                 cudaStream_t s) {
  GemvSegs segs;
  segs.o[0] = GemvOut{W, nullptr, y, N, false};
  segs.n = 1;
  segs.norm = norm;
  gemv_e<false>(e, segs, x, M, K, s);
}

void gemv_swiglu(Elem e, const void* Wg, const void* Wu, const float* x, float* y, int M, int N, int K,
                 cudaStream_t s, const GemvNorm& norm, const GemvPrefetch& next, bool rows_alike) {
  GemvSegs segs;
  segs.rows_alike = rows_alike;
  segs.norm = norm;
  segs.next = next;
  segs.o[0] = GemvOut{Wg, nullptr, y, N, false};
  segs.o[1] = GemvOut{Wu, nullptr, nullptr, N, false};
  segs.n = 1;  // the grid covers the N gate rows; kGlu reads segment 1's weights alongside
  gemv_e<true>(e, segs, x, M, K, s);
}

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t s) {
  launch(silu_mul_kernel, grid_for(n), 256, 0, s, gate, up, n);
}

void rope(float* x, int n, int nh, int hd, const float* cs, cudaStream_t s) {
  launch(rope_kernel, n, 128, 0, s, x, nh, hd, cs);
}

void append_plain(const PlainLayer& c, const float* k, const float* v, int n, int first, cudaStream_t s,
                  const float* kcs) {
  const dim3 grid(n, c.kvh);
  if (c.e == Elem::F32) launch(append_kernel<float>, grid, 128, 0, s, c, k, v, first, kcs);
  if (c.e == Elem::F16) launch(append_kernel<__half>, grid, 128, 0, s, c, k, v, first, kcs);
  if (c.e == Elem::BF16) launch(append_kernel<__nv_bfloat16>, grid, 128, 0, s, c, k, v, first, kcs);
}

int64_t attend_scratch_floats(int n, int nh, int hd, int len) {
  const int chunk = kivi_chunk(n) < kChunk ? kivi_chunk(n) : kChunk;  // enough for either kernel
  const int64_t S = (len + chunk - 1) / chunk;
  return int64_t(n) * nh * (S > 0 ? S : 1) * (hd + 2);
}

void attend_plain(const Attend& a, cudaStream_t s) {
  const int S = (a.len + kChunk - 1) / kChunk;
  const dim3 grid(S, a.nh, a.n);
  if (a.c.e == Elem::F32) launch(attend_kernel<float>, grid, kThreads, 0, s, a);
  if (a.c.e == Elem::F16) launch(attend_kernel<__half>, grid, kThreads, 0, s, a);
  if (a.c.e == Elem::BF16) launch(attend_kernel<__nv_bfloat16>, grid, kThreads, 0, s, a);
  if (S > 1) combine(a.part, a.n * a.nh, S, a.c.hd, a.out, s);  // one split wrote a.out itself
}

void append_plain_batch(const AppendPlainB* d, int B, int kvh, Elem e, cudaStream_t s) {
  const dim3 grid(B, kvh);
  if (e == Elem::F32) launch(append_batch_kernel<float>, grid, 128, 0, s, d);
  if (e == Elem::F16) launch(append_batch_kernel<__half>, grid, 128, 0, s, d);
  if (e == Elem::BF16) launch(append_batch_kernel<__nv_bfloat16>, grid, 128, 0, s, d);
}

void attend_plain_batch(const Attend* d, int B, int nh, int hd, int S, Elem e, cudaStream_t s) {
  const dim3 grid(S, nh, B);
  if (e == Elem::F32) launch(attend_batch_kernel<float>, grid, kThreads, 0, s, d);
  if (e == Elem::F16) launch(attend_batch_kernel<__half>, grid, kThreads, 0, s, d);
  if (e == Elem::BF16) launch(attend_batch_kernel<__nv_bfloat16>, grid, kThreads, 0, s, d);
  if (S > 1) launch(combine_batch_kernel<Attend>, dim3(nh, B), 128, 0, s, d, S, hd);
}

}  // namespace ptllm::cuda::k
