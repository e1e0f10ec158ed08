// CUDA kernels of the GPU decode path; see kernels.h for shapes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

#include "cuda/kernels.h"

namespace ptllm::cuda::k {
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

template <class T>
__global__ void convert_kernel(const float* src, T* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = narrow<T>(src[i]);
}

template <class T>
__global__ void embed_kernel(const T* E, const int32_t* ids, int H, float* x) {
  const T* row = E + int64_t(ids[blockIdx.x]) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) x[int64_t(blockIdx.x) * H + i] = widen(row[i]);
}

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int H, float* out) {
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

// wpr warps per output row n (wpr in 1, 2, 4, 8: several when N is small, so
// that a short projection still fills the GPU), up to 8 input rows: the weight
// row is streamed once (16-byte loads), each warp a strided share of K, and
// multiplied with every input row; partial sums meet in shared memory.
constexpr int kRows = 8, kWarps = 8;
template <class T, bool kVec>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const T* __restrict__ W, const float* __restrict__ x,
                                                           const float* __restrict__ bias, float* __restrict__ y,
                                                           int M, int N, int K, bool accumulate, int wpr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int part = warp % wpr;
  const int n = blockIdx.x * (kWarps / wpr) + warp / wpr;
  __shared__ float red[kWarps][kRows];
  float acc[kRows] = {};
  if (n < N) {
    const T* w = W + int64_t(n) * K;
    if (kVec) {
      for (int k0 = (part * 32 + lane) * 8; k0 < K; k0 += wpr * 32 * 8) {
        float wv[8];
        load8(w + k0, wv);
#pragma unroll
        for (int m = 0; m < kRows; ++m) {
          if (m < M) {
            float xv[8];
            load8(x + int64_t(m) * K + k0, xv);
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[m] = fmaf(wv[j], xv[j], acc[m]);
          }
        }
      }
    } else {
      for (int kk = part * 32 + lane; kk < K; kk += wpr * 32) {
        const float wv = widen(w[kk]);
#pragma unroll
        for (int m = 0; m < kRows; ++m)
          if (m < M) acc[m] = fmaf(wv, x[int64_t(m) * K + kk], acc[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    if (m < M) {
      const float v = warp_sum(acc[m]);
      if (lane == 0) red[warp][m] = v;
    }
  }
  __syncthreads();
  if (n < N && part == 0 && lane < M) {
    const int m = lane;
    float v = 0;
    for (int p = 0; p < wpr; ++p) v += red[warp + p][m];
    if (bias) v += bias[n];
    float* yo = y + int64_t(m) * N + n;
    *yo = accumulate ? *yo + v : v;
  }
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = g[i];
    g[i] = a / (1.f + expf(-a)) * u[i];
  }
}

__global__ void rope_kernel(float* x, int nh, int hd, const float* cs) {
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
__global__ void append_kernel(PlainLayer c, const float* k, const float* v, int first) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int64_t row = (int64_t(h) * c.cap + phys_row(c, first + t)) * c.hd;
  const float* ks = k + (int64_t(t) * c.kvh + h) * c.hd;
  const float* vs = v + (int64_t(t) * c.kvh + h) * c.hd;
  T* kd = static_cast<T*>(c.k) + row;
  T* vd = static_cast<T*>(c.v) + row;
  for (int i = threadIdx.x; i < c.hd; i += blockDim.x) {
    kd[i] = narrow<T>(ks[i]);
    vd[i] = narrow<T>(vs[i]);
  }
}

// Flash-decoding split: block (split s, head h, query i) covers kChunk slots;
// 4 warps score one slot each at a time (lanes over channels), softmax within
// the chunk, then the weighted V sum (threads over channels). Partials
// (max, sum, o[hd]) go to `part`; combine_kernel merges the splits.
constexpr int kChunk = 256, kThreads = 128, kMaxHd = 512;
template <class T>
__global__ void __launch_bounds__(kThreads) attend_kernel(Attend a) {
  const int s = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
  const PlainLayer& c = a.c;
  const int hd = c.hd, half = hd / 2, kvh = h / (a.nh / c.kvh);
  const int S = gridDim.x;
  __shared__ float qa[kMaxHd], qb[kMaxHd], p[kChunk];
  __shared__ float red[2];
  const float* q = a.q + (int64_t(i) * a.nh + h) * hd;
  const float* cs = a.qcs + int64_t(i) * 2 * hd;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float x0 = q[j], x1 = q[j + half];
    qa[j] = x0 * cs[j] - x1 * cs[half + j];
    qa[j + half] = x1 * cs[j] + x0 * cs[half + j];
    qb[j] = x0 * cs[hd + j] - x1 * cs[hd + half + j];
    qb[j + half] = x1 * cs[hd + j] + x0 * cs[hd + half + j];
  }
  __syncthreads();
  const int li = a.first + i + 1;  // slots this query sees
  const int b0 = s * kChunk, b1 = min(b0 + kChunk, li);
  float* part = a.part + ((int64_t(i) * a.nh + h) * S + s) * (hd + 2);
  if (b0 >= b1) {
    if (threadIdx.x == 0) { part[0] = -INFINITY; part[1] = 0; }
    return;
  }
  const T* K = static_cast<const T*>(c.k) + int64_t(kvh) * c.cap * hd;
  const T* V = static_cast<const T*>(c.v) + int64_t(kvh) * c.cap * hd;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int t = b0 + warp; t < b1; t += kThreads / 32) {
    const T* kr = K + phys_row(c, t) * hd;
    const float* qq = t < a.run_split ? qa : qb;
    float d = 0;
    for (int j = lane; j < hd; j += 32) d = fmaf(qq[j], widen(kr[j]), d);
    d = warp_sum(d);
    if (lane == 0) p[t - b0] = d * a.scale;
  }
  __syncthreads();
  const int len = b1 - b0;
  if (warp == 0) {
    float m = -INFINITY;
    for (int j = lane; j < len; j += 32) m = fmaxf(m, p[j]);
    m = warp_max(m);
    float l = 0;
    for (int j = lane; j < len; j += 32) {
      const float e = expf(p[j] - m);
      p[j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) { red[0] = m; red[1] = l; }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0;
    for (int t = 0; t < len; ++t) o = fmaf(p[t], widen(V[phys_row(c, b0 + t) * hd + j]), o);
    part[2 + j] = o;
  }
  if (threadIdx.x == 0) { part[0] = red[0]; part[1] = red[1]; }
}

__global__ void combine_kernel(const float* part, int S, int hd, float* out) {
  const int64_t qh = blockIdx.x;  // query * nh + head
  const float* pp = part + qh * S * (hd + 2);
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
    out[qh * hd + j] = L > 0 ? o / L : 0.f;
  }
}

// ---------------- Grouped KIVI ----------------
// The arithmetic of kv/quant.cc, ops/kivi_format.cc and kv/grouped_store.cc, done with
// explicitly rounded fp32 operations (no FMA contraction) so that a residual row
// quantises to the same codes and fp16 parameters as on the CPU.

__device__ __forceinline__ float h2f(uint16_t b) { return __half2float(__ushort_as_half(b)); }
__device__ __forceinline__ uint16_t f2h(float x) { return __half_as_ushort(__float2half_rn(x)); }
constexpr float kF16Max = 65504.f;
constexpr float kScaleFloor = 1e-5f;  // ops/kivi_format.h kScaleFloor
__device__ __forceinline__ float clamp_finite(float x) {
  if (isnan(x)) return 0.f;
  return x < -kF16Max ? -kF16Max : (x > kF16Max ? kF16Max : x);
}
// Neighbouring fp16 bit patterns (finite inputs), as kivi_format.cc.
__device__ __forceinline__ uint16_t next_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  if (h & 0x8000u) return uint16_t(h + 1);
  return uint16_t(h - 1);
}
__device__ __forceinline__ uint16_t next_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;
  if (h & 0x8000u) return uint16_t(h - 1);
  return uint16_t(h + 1);
}
__device__ __forceinline__ uint16_t half_round_down(float x) {  // Half::round_down
  x = clamp_finite(x);
  uint16_t h = f2h(x);
  if (h2f(h) > x) h = next_down(h);
  return h;
}
__device__ __forceinline__ uint16_t half_round_up(float x) {  // Half::round_up
  x = clamp_finite(x);
  uint16_t h = f2h(x);
  if (h2f(h) < x) h = next_up(h);
  return h;
}
// kivi::choose_params: zero rounded down, scale (from the stored zero) rounded up, floored.
__device__ __forceinline__ void choose_params(float lo, float hi, int levels, uint16_t& sb, uint16_t& zb) {
  zb = half_round_down(lo);
  float sc = __fdiv_rn(__fsub_rn(hi, h2f(zb)), float(levels));
  if (!(sc >= kScaleFloor)) sc = kScaleFloor;
  sb = half_round_up(sc);
}
// kivi::quantise with w = widen(params): u = int(clamp((x - zero) * (1 / scale), 0, levels) + 0.5).
__device__ __forceinline__ unsigned quantise(float x, float zero, float inv, int levels) {
  float t = __fmul_rn(__fsub_rn(x, zero), inv);
  t = t > 0.f ? t : 0.f;
  const float hi = float(levels);
  t = t < hi ? t : hi;
  return unsigned(int(__fadd_rn(t, 0.5f)));
}
template <int BITS>
__device__ __forceinline__ unsigned code_at(const uint8_t* row, int i) {
  if (BITS == 8) return row[i];
  if (BITS == 4) return (row[i >> 1] >> ((i & 1) * 4)) & 15u;
  return (row[i >> 2] >> ((i & 3) * 2)) & 3u;
}

// Sink / residual rows: fp16 saturated (an fp16 inf would make q.k or p.v inf/NaN), as put_row.
template <class T>
__device__ __forceinline__ T narrow_resid(float v) { return narrow<T>(v); }
template <>
__device__ __forceinline__ __half narrow_resid<__half>(float v) { return __float2half_rn(clamp_finite(v)); }

template <class T>
__global__ void kivi_append_kernel(KiviLayer c, const float* k, const float* v, bool to_sink, int dst) {
  const int t = blockIdx.x, h = blockIdx.y, hd = c.hd;
  const int64_t row = to_sink ? int64_t(h) * c.sink_cap + dst + t : int64_t(h) * c.res_cap + (dst + t) % c.res_cap;
  T* kd = static_cast<T*>(to_sink ? c.ksink : c.kres) + row * hd;
  T* vd = static_cast<T*>(to_sink ? c.vsink : c.vres) + row * hd;
  const float* ks = k + (int64_t(t) * c.kvh + h) * hd;
  const float* vs = v + (int64_t(t) * c.kvh + h) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    kd[i] = narrow_resid<T>(ks[i]);
    vd[i] = narrow_resid<T>(vs[i]);
  }
}

// K, one block per KV head, one thread per code byte (8/BITS channels): per channel the
// (scale, zero) over the G residual rows rsrc.. (ring), then the G codes of each channel.
template <class T, int BITS>
__global__ void kivi_flush_k_kernel(KiviLayer c, int qdst, int rsrc, int gslot) {
  constexpr int per = 8 / BITS, levels = (1 << BITS) - 1;
  const int h = blockIdx.x, hd = c.hd, G = c.G;
  const T* res = static_cast<const T*>(c.kres) + int64_t(h) * c.res_cap * hd;
  uint16_t* par = c.kparams + (int64_t(h) * c.gcap + gslot) * hd * 2;
  for (int j = threadIdx.x; j < c.row; j += blockDim.x) {
    float zero[per], inv[per];
    for (int e = 0; e < per; ++e) {
      const int ch = j * per + e;
      if (ch >= hd) break;
      float lo = INFINITY, hi = -INFINITY;
      for (int t = 0; t < G; ++t) {
        const float x = widen(res[int64_t((rsrc + t) % c.res_cap) * hd + ch]);
        lo = x < lo ? x : lo;  // std::min(lo, x)
        hi = hi < x ? x : hi;  // std::max(hi, x)
      }
      uint16_t sb, zb;
      choose_params(lo, hi, levels, sb, zb);
      par[2 * ch] = sb;
      par[2 * ch + 1] = zb;
      zero[e] = h2f(zb);
      inv[e] = __fdiv_rn(1.f, h2f(sb));
    }
    for (int t = 0; t < G; ++t) {
      const T* r = res + int64_t((rsrc + t) % c.res_cap) * hd;
      unsigned b = 0;
      for (int e = 0; e < per; ++e) {
        const int ch = j * per + e;
        if (ch >= hd) break;
        b |= quantise(widen(r[ch]), zero[e], inv[e], levels) << (BITS * e);
      }
      c.kcodes[(int64_t(h) * c.cap + (qdst + t) % c.cap) * c.row + j] = uint8_t(b);
    }
  }
}

// V, one block per (token t of the group, KV head): the row's (scale, zero), then its codes.
template <class T, int BITS>
__global__ void kivi_flush_v_kernel(KiviLayer c, int qdst, int rsrc) {
  constexpr int per = 8 / BITS, levels = (1 << BITS) - 1;
  const int t = blockIdx.x, h = blockIdx.y, hd = c.hd;
  const T* r = static_cast<const T*>(c.vres) + (int64_t(h) * c.res_cap + (rsrc + t) % c.res_cap) * hd;
  float lo = INFINITY, hi = -INFINITY;
  for (int ch = threadIdx.x; ch < hd; ch += blockDim.x) {
    const float x = widen(r[ch]);
    lo = x < lo ? x : lo;
    hi = hi < x ? x : hi;
  }
  for (int o = 16; o > 0; o >>= 1) {  // min/max: exact in any order
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  __shared__ float rlo[32], rhi[32];
  __shared__ float pz, pinv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (lane == 0) { rlo[warp] = lo; rhi[warp] = hi; }
  __syncthreads();
  const int prow = (qdst + t) % c.cap;
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w) { lo = fminf(lo, rlo[w]); hi = fmaxf(hi, rhi[w]); }
    uint16_t sb, zb;
    choose_params(lo, hi, levels, sb, zb);
    uint16_t* par = c.vparams + (int64_t(h) * c.cap + prow) * 2;
    par[0] = sb;
    par[1] = zb;
    pz = h2f(zb);
    pinv = __fdiv_rn(1.f, h2f(sb));
  }
  __syncthreads();
  uint8_t* dst = c.vcodes + (int64_t(h) * c.cap + prow) * c.row;
  for (int j = threadIdx.x; j < c.row; j += blockDim.x) {
    unsigned b = 0;
    for (int e = 0; e < per; ++e) {
      const int ch = j * per + e;
      if (ch >= hd) break;
      b |= quantise(widen(r[ch]), pz, pinv, levels) << (BITS * e);
    }
    dst[j] = uint8_t(b);
  }
}

// attend_kernel over a KIVI layer, for hpb query heads of one KV head per block
// (GQA: the group's heads share each code row, parameter and slot-table row read;
// block (split s, head block y, query i) covers heads y*hpb .. y*hpb+hpb-1).
// Slot t of the sequence: a sink row, quantised token t - n_sink (codes, K parameters
// of its group / V parameters of its row) or a residual row. A key pair (i, i + hd/2)
// is widened (u * scale + zero for codes) in registers, turned by the slot table row
// t and dotted with each head's query: the codes are read in place, never written out.
// Each head's arithmetic is the same, in the same order, whatever hpb is.
constexpr int kMaxHpb = 8;
template <class T, int BITS>
__global__ void __launch_bounds__(kThreads) attend_kivi_kernel(AttendKivi a, int hpb, int chunk) {
  extern __shared__ float sm[];
  const int s = blockIdx.x, h0 = blockIdx.y * hpb, i = blockIdx.z;
  const KiviLayer& c = a.c;
  const int hd = c.hd, half = hd / 2, kvh = h0 / (a.nh / c.kvh);
  const int S = gridDim.x;
  float* qa = sm;                 // [hpb, hd] queries turned for slots < run_split
  float* qb = qa + hpb * hd;      // [hpb, hd] and for the others
  float* p = qb + hpb * hd;       // [hpb, chunk] scores, then exp
  float* red = p + hpb * chunk;   // [hpb, 2] max, sum
  for (int g = 0; g < hpb; ++g) {
    const float* q = a.q + (int64_t(i) * a.nh + h0 + g) * hd;
    const float* qc = a.qcs + int64_t(i) * 2 * hd;
    float* ga = qa + g * hd;
    float* gb = qb + g * hd;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
      const float x0 = q[j], x1 = q[j + half];
      ga[j] = x0 * qc[j] - x1 * qc[half + j];
      ga[j + half] = x1 * qc[j] + x0 * qc[half + j];
      gb[j] = x0 * qc[hd + j] - x1 * qc[hd + half + j];
      gb[j + half] = x1 * qc[hd + j] + x0 * qc[hd + half + j];
    }
  }
  __syncthreads();
  const int li = a.first + i + 1;
  const int b0 = s * chunk, b1 = min(b0 + chunk, li);
  const auto part_of = [&](int g) { return a.part + ((int64_t(i) * a.nh + h0 + g) * S + s) * (hd + 2); };
  if (b0 >= b1) {
    if (threadIdx.x < hpb) {
      float* pt = part_of(threadIdx.x);
      pt[0] = -INFINITY;
      pt[1] = 0;
    }
    return;
  }
  const int ns = c.n_sink, nq = c.n_quant, qe = ns + nq;
  const T* ksink = static_cast<const T*>(c.ksink) + int64_t(kvh) * c.sink_cap * hd;
  const T* vsink = static_cast<const T*>(c.vsink) + int64_t(kvh) * c.sink_cap * hd;
  const T* kres = static_cast<const T*>(c.kres) + int64_t(kvh) * c.res_cap * hd;
  const T* vres = static_cast<const T*>(c.vres) + int64_t(kvh) * c.res_cap * hd;
  const uint8_t* kcodes = c.kcodes + int64_t(kvh) * c.cap * c.row;
  const uint8_t* vcodes = c.vcodes + int64_t(kvh) * c.cap * c.row;
  const uint16_t* kpar = c.kparams + int64_t(kvh) * c.gcap * hd * 2;
  const uint16_t* vpar = c.vparams + int64_t(kvh) * c.cap * 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int t = b0 + warp; t < b1; t += kThreads / 32) {
    const float* qq = t < a.run_split ? qa : qb;
    const float* cs = a.kcs + int64_t(t) * hd;
    float d[kMaxHpb];
#pragma unroll
    for (int g = 0; g < kMaxHpb; ++g) d[g] = 0.f;
    const bool full = t < ns || t >= qe;
    const T* kr = t < ns ? ksink + int64_t(t) * hd : kres + int64_t((c.rstart + t - qe) % c.res_cap) * hd;
    const int jq = t - ns;
    const int gi = jq < c.g0 ? 0 : 1 + (jq - c.g0) / c.G;
    const uint16_t* par = kpar + int64_t((c.gstart + gi) % c.gcap) * hd * 2;
    const uint8_t* code = kcodes + int64_t((c.qstart + jq) % c.cap) * c.row;
    for (int j = lane; j < half; j += 32) {
      float x0, x1;
      if (full) {
        x0 = widen(kr[j]);
        x1 = widen(kr[j + half]);
      } else {
        x0 = fmaf(float(code_at<BITS>(code, j)), h2f(par[2 * j]), h2f(par[2 * j + 1]));
        x1 = fmaf(float(code_at<BITS>(code, j + half)), h2f(par[2 * (j + half)]), h2f(par[2 * (j + half) + 1]));
      }
      const float co = cs[j], si = cs[half + j];
      const float r0 = x0 * co - x1 * si, r1 = x1 * co + x0 * si;
#pragma unroll
      for (int g = 0; g < kMaxHpb; ++g) {
        if (g < hpb) {
          d[g] = fmaf(qq[g * hd + j], r0, d[g]);
          d[g] = fmaf(qq[g * hd + j + half], r1, d[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxHpb; ++g) {
      if (g < hpb) {
        const float v = warp_sum(d[g]);
        if (lane == 0) p[g * chunk + t - b0] = v * a.scale;
      }
    }
  }
  __syncthreads();
  const int len = b1 - b0;
  for (int g = warp; g < hpb; g += kThreads / 32) {  // one warp per head's softmax
    float* pg = p + g * chunk;
    float m = -INFINITY;
    for (int j = lane; j < len; j += 32) m = fmaxf(m, pg[j]);
    m = warp_max(m);
    float l = 0;
    for (int j = lane; j < len; j += 32) {
      const float e = expf(pg[j] - m);
      pg[j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (lane == 0) { red[2 * g] = m; red[2 * g + 1] = l; }
  }
  __syncthreads();
  // Runs of the chunk: sinks [b0, e0), codes [e0, e1), residual [e1, b1).
  const int e0 = min(max(b0, ns), b1), e1 = min(max(b0, qe), b1);
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float o[kMaxHpb];
#pragma unroll
    for (int g = 0; g < kMaxHpb; ++g) o[g] = 0.f;
    const auto acc = [&](int t, float v) {
#pragma unroll
      for (int g = 0; g < kMaxHpb; ++g)
        if (g < hpb) o[g] = fmaf(p[g * chunk + t - b0], v, o[g]);
    };
    for (int t = b0; t < e0; ++t) acc(t, widen(vsink[int64_t(t) * hd + j]));
    for (int t = e0; t < e1; ++t) {
      const int prow = (c.qstart + t - ns) % c.cap;
      acc(t, fmaf(float(code_at<BITS>(vcodes + int64_t(prow) * c.row, j)), h2f(vpar[2 * prow]),
                  h2f(vpar[2 * prow + 1])));
    }
    for (int t = e1; t < b1; ++t) acc(t, widen(vres[int64_t((c.rstart + t - qe) % c.res_cap) * hd + j]));
#pragma unroll
    for (int g = 0; g < kMaxHpb; ++g)
      if (g < hpb) part_of(g)[2 + j] = o[g];
  }
  if (threadIdx.x < hpb) {
    float* pt = part_of(threadIdx.x);
    pt[0] = red[2 * threadIdx.x];
    pt[1] = red[2 * threadIdx.x + 1];
  }
}

// Slots per split of the KIVI kernel: decode steps (a few queries) use short splits
// so that a GQA block of heads still leaves enough blocks for the whole GPU
// (1B shape at depth 4,096: 64 splits x 8 KV heads); prefill chunks use kChunk.
int kivi_chunk(int n) { return n <= 8 ? 64 : kChunk; }

int grid_for(int64_t n) { return int((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

}  // namespace

void convert(const float* src, Elem e, void* dst, int64_t n, cudaStream_t s) {
  const int g = grid_for(n) > 0 ? grid_for(n) : 1;
  if (e == Elem::F32) convert_kernel<float><<<g, 256, 0, s>>>(src, static_cast<float*>(dst), n);
  if (e == Elem::F16) convert_kernel<__half><<<g, 256, 0, s>>>(src, static_cast<__half*>(dst), n);
  if (e == Elem::BF16) convert_kernel<__nv_bfloat16><<<g, 256, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
}

void embed(Elem e, const void* E, const int32_t* ids, int n, int H, float* x, cudaStream_t s) {
  if (e == Elem::F32) embed_kernel<<<n, 256, 0, s>>>(static_cast<const float*>(E), ids, H, x);
  if (e == Elem::F16) embed_kernel<<<n, 256, 0, s>>>(static_cast<const __half*>(E), ids, H, x);
  if (e == Elem::BF16) embed_kernel<<<n, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(E), ids, H, x);
}

void rmsnorm(const float* x, const float* w, float eps, int n, int H, float* out, cudaStream_t s) {
  rmsnorm_kernel<<<n, 256, 0, s>>>(x, w, eps, H, out);
}

template <class T>
static void gemv_t(const void* W, const float* x, const float* bias, float* y, int M, int N, int K, bool acc,
                   cudaStream_t s) {
  // Enough warps for the whole GPU (~132 SMs x 64 warps): split K over up to 8 warps per row.
  int wpr = 1;
  while (wpr < kWarps && int64_t(N) * wpr < 16384 && K >= wpr * 2 * 256) wpr *= 2;
  const int rows_per_block = kWarps / wpr;
  const dim3 grid((N + rows_per_block - 1) / rows_per_block);
  for (int m0 = 0; m0 < M; m0 += kRows) {
    const int m = M - m0 < kRows ? M - m0 : kRows;
    if (K % 8 == 0)
      gemv_kernel<T, true><<<grid, kWarps * 32, 0, s>>>(static_cast<const T*>(W), x + int64_t(m0) * K, bias,
                                                        y + int64_t(m0) * N, m, N, K, acc, wpr);
    else
      gemv_kernel<T, false><<<grid, kWarps * 32, 0, s>>>(static_cast<const T*>(W), x + int64_t(m0) * K, bias,
                                                         y + int64_t(m0) * N, m, N, K, acc, wpr);
  }
}

void gemv(Elem e, const void* W, const float* x, const float* bias, float* y, int M, int N, int K, bool acc,
          cudaStream_t s) {
  if (e == Elem::F32) gemv_t<float>(W, x, bias, y, M, N, K, acc, s);
  if (e == Elem::F16) gemv_t<__half>(W, x, bias, y, M, N, K, acc, s);
  if (e == Elem::BF16) gemv_t<__nv_bfloat16>(W, x, bias, y, M, N, K, acc, s);
}

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t s) {
  silu_mul_kernel<<<grid_for(n), 256, 0, s>>>(gate, up, n);
}

void rope(float* x, int n, int nh, int hd, const float* cs, cudaStream_t s) {
  rope_kernel<<<n, 128, 0, s>>>(x, nh, hd, cs);
}

void append_plain(const PlainLayer& c, const float* k, const float* v, int n, int first, cudaStream_t s) {
  const dim3 grid(n, c.kvh);
  if (c.e == Elem::F32) append_kernel<float><<<grid, 128, 0, s>>>(c, k, v, first);
  if (c.e == Elem::F16) append_kernel<__half><<<grid, 128, 0, s>>>(c, k, v, first);
  if (c.e == Elem::BF16) append_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(c, k, v, first);
}

int64_t attend_scratch_floats(int n, int nh, int hd, int len) {
  const int chunk = kivi_chunk(n) < kChunk ? kivi_chunk(n) : kChunk;  // enough for either kernel
  const int64_t S = (len + chunk - 1) / chunk;
  return int64_t(n) * nh * (S > 0 ? S : 1) * (hd + 2);
}

void attend_plain(const Attend& a, cudaStream_t s) {
  const int S = (a.len + kChunk - 1) / kChunk;
  const dim3 grid(S, a.nh, a.n);
  if (a.c.e == Elem::F32) attend_kernel<float><<<grid, kThreads, 0, s>>>(a);
  if (a.c.e == Elem::F16) attend_kernel<__half><<<grid, kThreads, 0, s>>>(a);
  if (a.c.e == Elem::BF16) attend_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(a);
  combine_kernel<<<a.n * a.nh, 128, 0, s>>>(a.part, S, a.c.hd, a.out);
}

namespace {

// Dispatch on the residual storage and the code width.
template <template <class, int> class F, class... A>
void kivi_dispatch(const KiviLayer& c, A&&... args) {
  const auto by_bits = [&](auto tag) {
    using T = decltype(tag);
    if (c.bits == 8) F<T, 8>::run(args...);
    if (c.bits == 4) F<T, 4>::run(args...);
    if (c.bits == 2) F<T, 2>::run(args...);
  };
  if (c.re == Elem::F32) by_bits(float{});
  if (c.re == Elem::F16) by_bits(__half{});
  if (c.re == Elem::BF16) by_bits(__nv_bfloat16{});
}

template <class T, int BITS>
struct FlushLaunch {
  static void run(const KiviLayer& c, int qdst, int rsrc, int gslot, cudaStream_t s) {
    const int kth = c.row < 128 ? ((c.row + 31) / 32) * 32 : 128;
    kivi_flush_k_kernel<T, BITS><<<c.kvh, kth, 0, s>>>(c, qdst, rsrc, gslot);
    kivi_flush_v_kernel<T, BITS><<<dim3(c.G, c.kvh), 128, 0, s>>>(c, qdst, rsrc);
  }
};
template <class T, int BITS>
struct AttendKiviLaunch {
  static void run(const AttendKivi& a, dim3 grid, int hpb, int chunk, size_t shmem, cudaStream_t s) {
    attend_kivi_kernel<T, BITS><<<grid, kThreads, shmem, s>>>(a, hpb, chunk);
  }
};

}  // namespace

void kivi_append(const KiviLayer& c, const float* k, const float* v, int n, bool to_sink, int dst, cudaStream_t s) {
  if (n <= 0) return;
  const dim3 grid(n, c.kvh);
  if (c.re == Elem::F32) kivi_append_kernel<float><<<grid, 128, 0, s>>>(c, k, v, to_sink, dst);
  if (c.re == Elem::F16) kivi_append_kernel<__half><<<grid, 128, 0, s>>>(c, k, v, to_sink, dst);
  if (c.re == Elem::BF16) kivi_append_kernel<__nv_bfloat16><<<grid, 128, 0, s>>>(c, k, v, to_sink, dst);
}

void kivi_flush(const KiviLayer& c, int qdst, int rsrc, int gslot, cudaStream_t s) {
  kivi_dispatch<FlushLaunch>(c, c, qdst, rsrc, gslot, s);
}

void attend_kivi(const AttendKivi& a, cudaStream_t s) {
  const int chunk = kivi_chunk(a.n);
  const int S = (a.len + chunk - 1) / chunk;
  // Heads per block: the largest divisor of the GQA group up to kMaxHpb (shared
  // memory 4 * hpb * (2 hd + chunk + 2) bytes: <= 41 KB at hd 512).
  // Only with enough splits (S >= 8): a short sequence has few blocks to spread
  // over the GPU, and one head per block keeps them all (1B shape at depth 0:
  // 64 blocks of 1 head instead of 16 of 4).
  const int grp = a.nh / a.c.kvh;
  int hpb = 1;
  for (int d = kMaxHpb; d > 1 && S >= 8; --d)
    if (grp % d == 0) { hpb = d; break; }
  const size_t shmem = size_t(hpb) * size_t(2 * a.c.hd + chunk + 2) * sizeof(float);
  const dim3 grid(S, a.nh / hpb, a.n);
  kivi_dispatch<AttendKiviLaunch>(a.c, a, grid, hpb, chunk, shmem, s);
  combine_kernel<<<a.n * a.nh, 128, 0, s>>>(a.part, S, a.c.hd, a.out);
}

}  // namespace ptllm::cuda::k
