// CUDA kernels of the grouped KIVI cache: append to the residual, quantise a
// full group (K per channel, V per token), and the fused decode attention over
// the packed codes + residual + sinks. Shapes: kernels.h.
#include "cuda/kernels_common.cuh"

#include <type_traits>

namespace ptllm::cuda::k {
namespace {

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
  pdl_enter();
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
  pdl_enter();
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
  pdl_enter();
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

// One KV head's rows of a KIVI layer: the offsets every attention kernel starts from.
template <class T>
struct KiviHeadRows {
  const T *ksink, *vsink, *kres, *vres;  // [sink_cap, hd], [res_cap, hd] full-precision rows
  const uint8_t *kcodes, *vcodes;        // [cap, row] code rows
  const uint16_t* kpar;                  // [gcap, hd, 2] K (scale, zero) per group slot and channel
  const uint16_t* vpar;                  // [cap, 2] V (scale, zero) per code row
  __device__ __forceinline__ KiviHeadRows(const KiviLayer& c, int h)
      : ksink(static_cast<const T*>(c.ksink) + int64_t(h) * c.sink_cap * c.hd),
        vsink(static_cast<const T*>(c.vsink) + int64_t(h) * c.sink_cap * c.hd),
        kres(static_cast<const T*>(c.kres) + int64_t(h) * c.res_cap * c.hd),
        vres(static_cast<const T*>(c.vres) + int64_t(h) * c.res_cap * c.hd),
        kcodes(c.kcodes + int64_t(h) * c.cap * c.row),
        vcodes(c.vcodes + int64_t(h) * c.cap * c.row),
        kpar(c.kparams + int64_t(h) * c.gcap * c.hd * 2),
        vpar(c.vparams + int64_t(h) * c.cap * 2) {}
};

// attend_kernel over a KIVI layer, for hpb query heads of one KV head per block
// (GQA: the group's heads share each code row, parameter and slot-table row read;
// block (head block x, split s, query i) covers heads x*hpb .. x*hpb+hpb-1).
// Slot t of the sequence: a sink row, quantised token t - n_sink (codes, K parameters
// of its group / V parameters of its row) or a residual row. A key pair (i, i + hd/2)
// is widened (u * scale + zero for codes) in registers, turned by the slot table row
// t and dotted with each head's query: the codes are read in place, never written out.
// Each head's arithmetic is the same, in the same order, whatever hpb is.
constexpr int kMaxHpb = 8;
template <class T, int BITS>
__device__ __forceinline__ void attend_kivi_body(const AttendKivi& a, int i, int hpb, int chunk) {
  extern __shared__ float sm[];
  // Grid (head block, split, query or sequence): the head blocks of one split run
  // side by side, so the split's slot-table rows are read from DRAM about once.
  const int s = blockIdx.y, h0 = blockIdx.x * hpb;
  const KiviLayer& c = a.c;
  const int hd = c.hd, half = hd / 2, kvh = h0 / (a.nh / c.kvh);
  const int S = gridDim.y;
  float* qa = sm;                 // [hpb, hd] queries turned for slots < run_split
  float* qb = qa + hpb * hd;      // [hpb, hd] and for the others
  float* p = qb + hpb * hd;       // [hpb, chunk] scores, then exp
  float* red = p + hpb * chunk;   // [hpb, 2] max, sum
  for (int g = 0; g < hpb; ++g) {
    const float* q = a.q + (int64_t(i) * a.nh + h0 + g) * hd;
    const float* qc = a.qcs + int64_t(i) * 2 * hd;
    rotate_query_runs(q, qc, hd, qa + g * hd, qb + g * hd);
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
  const KiviHeadRows<T> hr(c, kvh);
  const T *ksink = hr.ksink, *vsink = hr.vsink, *kres = hr.kres, *vres = hr.vres;
  const uint8_t *kcodes = hr.kcodes, *vcodes = hr.vcodes;
  const uint16_t* kpar = hr.kpar;
  const uint16_t* vpar = hr.vpar;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float2* kcs2 = reinterpret_cast<const float2*>(a.kcs);  // [hd/2, cap] (cos, sin)
  for (int t = b0 + warp; t < b1; t += kThreads / 32) {
    const float* qq = t < a.run_split ? qa : qb;
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
      const float2 cs2 = kcs2[int64_t(j) * c.cap + t];
      const float co = cs2.x, si = cs2.y;
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
    float m, l;
    warp_softmax_exp(p + g * chunk, len, lane, m, l);
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

template <class T, int BITS>
__global__ void __launch_bounds__(kThreads) attend_kivi_kernel(AttendKivi a, int hpb, int chunk) {
  pdl_enter();
  attend_kivi_body<T, BITS>(a, blockIdx.z, hpb, chunk);
}

// Batched decode: block (split, head block, sequence); the sequence's parameters staged in shared memory.
template <class T, int BITS>
__global__ void __launch_bounds__(kThreads) attend_kivi_batch_kernel(const AttendKivi* as, int hpb, int chunk) {
  pdl_enter();
  const AttendKivi& a = stage_params(as + blockIdx.z);
  attend_kivi_body<T, BITS>(a, 0, hpb, chunk);
}


// ---- The decode kernel: one query per sequence, lanes over slots ----
// Block (KV head h, split s, sequence), kDecChunk threads over the split's kDecChunk
// slots; all GRP query heads of h in the block, so each code row, parameter word and
// slot-table pair is read once per block. Why this shape (docs/CUDA.md, Session 7):
// the previous kernel (a warp per slot, lanes over channels) spent its time on
// per-element loads and a 5-step shuffle reduction per head per slot; here a thread
// owns a slot and runs its whole dot products in registers, no reduction at all.
//  K: thread t holds its code row in registers (hd * BITS / 32 words, 16-byte loads),
//     per channel pair (i, i + hd/2) widens u * scale + zero with its group's fp16
//     (scale, zero) words (the same words for all slots of a group: broadcast loads),
//     turns the pair by the slot's (cos, sin) (table [hd/2, cap]: 256 coalesced bytes
//     per warp and pair) and adds q_g . r for the GRP rotated queries (shared memory,
//     [hd/2][lo 8 | hi 8] floats: two broadcast 16-byte loads per pair for GRP <= 4).
//  V: the scale folded into the softmax weight (w = p * scale per slot and head), the
//     zero into one bias per head (sum p * zero), as ops/kivi_kernels.h does:
//       sum_t p_t (s_t u_t + z_t) = sum_t (p_t s_t) u_t + sum_t p_t z_t.
//     Thread (cw, sl): 8 channels cw*8.. of every SL-th slot; the SL slot lanes'
//     sums meet in shared memory at the end.
// Sink and residual slots take the same loops with full-precision rows.
constexpr int kDecChunk = kKiviDecChunk;  // kernels.h

__device__ __forceinline__ float u2f(unsigned u) {  // exact for u < 2^23, no I2F
  return __uint_as_float(0x4B000000u | u) - 8388608.f;
}
template <int BITS>
__device__ __forceinline__ unsigned code_w(const uint32_t* w, int i) {  // i: a constant after unrolling
  constexpr int cpw = 32 / BITS;
  return (w[i / cpw] >> ((i % cpw) * BITS)) & ((1u << BITS) - 1u);
}
__device__ __forceinline__ float2 par_f2(uint32_t w) {  // (scale, zero) fp16 pair -> fp32
  return make_float2(h2f(uint16_t(w & 0xffffu)), h2f(uint16_t(w >> 16)));
}
template <int GRP>
__device__ __forceinline__ void rot_dot(const float* qq, float x0, float x1, float2 cs, float* acc) {
  const float r0 = x0 * cs.x - x1 * cs.y, r1 = x1 * cs.x + x0 * cs.y;
  const float4 l0 = *reinterpret_cast<const float4*>(qq), h0 = *reinterpret_cast<const float4*>(qq + 8);
  const float ql[4] = {l0.x, l0.y, l0.z, l0.w}, qh[4] = {h0.x, h0.y, h0.z, h0.w};
#pragma unroll
  for (int g = 0; g < (GRP < 4 ? GRP : 4); ++g) acc[g] = fmaf(qh[g], r1, fmaf(ql[g], r0, acc[g]));
  if (GRP > 4) {
    const float4 l1 = *reinterpret_cast<const float4*>(qq + 4), h1 = *reinterpret_cast<const float4*>(qq + 12);
    const float ql1[4] = {l1.x, l1.y, l1.z, l1.w}, qh1[4] = {h1.x, h1.y, h1.z, h1.w};
#pragma unroll
    for (int g = 4; g < GRP; ++g) acc[g] = fmaf(qh1[g - 4], r1, fmaf(ql1[g - 4], r0, acc[g]));
  }
}
// The GRP queries of KV head h, turned by their own angle for slots < run_split (A) and
// the others (B), in rot_dot's layout: qs [2 runs][HD/2][lo 8 | hi 8].
template <int HD, int GRP>
__device__ __forceinline__ void turn_queries(const AttendKivi& a, int h, int tid, float* qs) {
  constexpr int half = HD / 2;
  for (int e = tid; e < GRP * half; e += kDecChunk) {
    const int g = e / half, j = e % half;
    const float* q = a.q + (int64_t(h) * GRP + g) * HD;
    const float* qc = a.qcs;
    const float x0 = q[j], x1 = q[j + half];
    float* A = qs + j * 16;
    float* B = qs + (half + j) * 16;
    A[g] = x0 * qc[j] - x1 * qc[half + j];
    A[8 + g] = x1 * qc[j] + x0 * qc[half + j];
    B[g] = x0 * qc[HD + j] - x1 * qc[HD + half + j];
    B[8 + g] = x1 * qc[HD + j] + x0 * qc[HD + half + j];
  }
}

// A 16-byte (or smaller) word of a code row: through the read-only cache from global
// memory (kind 1) or a plain load from the tile's shared-memory copy (kind 2).
template <bool kGlobal, class W>
__device__ __forceinline__ W code_load(const W* p) {
  if constexpr (kGlobal) return __ldg(p);
  else return *p;
}

// The K phase for slot t (one slot per thread): p_out[g * kDecChunk] = scale * q_g . k_t for
// the GRP queries, k_t turned by its column of the slot table kcs2 [hd/2, cap] (cos, sin)
// (a.kcs, read once by the caller). A sink or residual slot reads its
// full-precision row; a quantised one its code row (row_of(jq): 16-byte words, jq = t -
// n_sink) and its group's (scale, zero) words.
template <class T, int BITS, int HD, int GRP, bool kGlobal, class RowOf>
__device__ __forceinline__ void slot_scores(const AttendKivi& a, const KiviHeadRows<T>& hr, int ns, int qe,
                                            const float* qs, const float2* kcs2, int t, RowOf row_of, float* p_out) {
  constexpr int half = HD / 2;
  const KiviLayer& c = a.c;
  float acc[GRP];
#pragma unroll
  for (int g = 0; g < GRP; ++g) acc[g] = 0.f;
  const float* qq = qs + (t < a.run_split ? 0 : half * 16);
  const float2* tab = kcs2 + t;  // pair i at tab[i * cap]
  if (t < ns || t >= qe) {
    const T* kr = t < ns ? hr.ksink + int64_t(t) * HD : hr.kres + int64_t((c.rstart + t - qe) % c.res_cap) * HD;
#pragma unroll 4
    for (int i = 0; i < half; ++i)
      rot_dot<GRP>(qq + i * 16, widen(kr[i]), widen(kr[i + half]), __ldg(tab + int64_t(i) * c.cap), acc);
  } else {
    const int jq = t - ns;
    const int gi = jq < c.g0 ? 0 : 1 + (jq - c.g0) / c.G;
    // The group's (scale, zero) words, one per channel; 4 channels per 16-byte load.
    const uint4* par = reinterpret_cast<const uint4*>(hr.kpar + int64_t((c.gstart + gi) % c.gcap) * HD * 2);
    constexpr int NW = HD * BITS / 32;  // code words per row (a multiple of 4 for HD 64 / 128)
    uint32_t w[NW];
    const uint4* row = row_of(jq);
#pragma unroll
    for (int k4 = 0; k4 < NW / 4; ++k4) {
      const uint4 x = code_load<kGlobal>(row + k4);
      w[4 * k4] = x.x;
      w[4 * k4 + 1] = x.y;
      w[4 * k4 + 2] = x.z;
      w[4 * k4 + 3] = x.w;
    }
#pragma unroll
    for (int i4 = 0; i4 < half; i4 += 4) {
      const uint4 pl = __ldg(par + i4 / 4), ph = __ldg(par + (half + i4) / 4);
      const uint32_t wl[4] = {pl.x, pl.y, pl.z, pl.w}, wh[4] = {ph.x, ph.y, ph.z, ph.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i4 + e;
        const float2 lo = par_f2(wl[e]), hi = par_f2(wh[e]);
        const float x0 = fmaf(u2f(code_w<BITS>(w, i)), lo.x, lo.y);
        const float x1 = fmaf(u2f(code_w<BITS>(w, i + half)), hi.x, hi.y);
        rot_dot<GRP>(qq + i * 16, x0, x1, __ldg(tab + int64_t(i) * c.cap), acc);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < GRP; ++g) p_out[g * kDecChunk] = acc[g] * a.scale;
}

// The V phase for slot t: o[g][e] += p_g(t) * v_t[cw * 8 + e] for the thread's 8 channels.
// A quantised slot (its (scale, zero) pair sz, its 8 codes at cr, BITS bytes) takes the
// scale into the weight and the zero into bz (sum_t p_t (s_t u_t + z_t) = sum_t (p_t s_t)
// u_t + sum_t p_t z_t, as ops/kivi_kernels.h); a sink or residual slot its full-precision row.
template <class T, int BITS, int GRP, bool kGlobal>
__device__ __forceinline__ void slot_values_quant(float2 sz, const uint8_t* cr, const float* pw, float (*o)[8],
                                                  float* bz) {
  uint32_t cwd[2];
  if (BITS == 8) {
    const uint2 x = code_load<kGlobal>(reinterpret_cast<const uint2*>(cr));
    cwd[0] = x.x;
    cwd[1] = x.y;
  } else if (BITS == 4) {
    cwd[0] = code_load<kGlobal>(reinterpret_cast<const uint32_t*>(cr));
  } else {
    cwd[0] = code_load<kGlobal>(reinterpret_cast<const uint16_t*>(cr));
  }
  float ws[GRP];
#pragma unroll
  for (int g = 0; g < GRP; ++g) {
    ws[g] = pw[g] * sz.x;
    bz[g] = fmaf(pw[g], sz.y, bz[g]);
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float u = u2f(code_w<BITS>(cwd, e));
#pragma unroll
    for (int g = 0; g < GRP; ++g) o[g][e] = fmaf(ws[g], u, o[g][e]);
  }
}
template <class T, int HD, int GRP>
__device__ __forceinline__ void slot_values_full(const KiviLayer& c, const KiviHeadRows<T>& hr, int ns, int qe, int t,
                                                 int cw, const float* pw, float (*o)[8]) {
  const T* vr = t < ns ? hr.vsink + int64_t(t) * HD : hr.vres + int64_t((c.rstart + t - qe) % c.res_cap) * HD;
  float x[8];
  load8<T>(vr + cw * 8, x);
#pragma unroll
  for (int g = 0; g < GRP; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) o[g][e] = fmaf(pw[g], x[e], o[g][e]);
}

// The end of a split: the SL slot lanes' V sums (each with its zero bias) meet through
// vred [SL][GRP][HD] and go to the split's partial rows with the softmax's (max, sum),
// ml [GRP][ml_stride]. part_of(g): head g's row [m, l, o[HD]]. Barrier inside.
template <int HD, int GRP, class PartOf>
__device__ __forceinline__ void write_split(float* vred, const float (*o)[8], const float* bz, int tid, int sl, int cw,
                                            const float* ml, int ml_stride, PartOf part_of) {
  constexpr int SL = kDecChunk / (HD / 8);
#pragma unroll
  for (int g = 0; g < GRP; ++g) {
    float4* d = reinterpret_cast<float4*>(vred + (sl * GRP + g) * HD + cw * 8);
    d[0] = make_float4(o[g][0] + bz[g], o[g][1] + bz[g], o[g][2] + bz[g], o[g][3] + bz[g]);
    d[1] = make_float4(o[g][4] + bz[g], o[g][5] + bz[g], o[g][6] + bz[g], o[g][7] + bz[g]);
  }
  __syncthreads();
  for (int e = tid; e < GRP * HD; e += kDecChunk) {
    const int g = e / HD, j = e % HD;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < SL; ++k) sum += vred[(k * GRP + g) * HD + j];
    part_of(g)[2 + j] = sum;
  }
  if (tid < GRP) {
    float* pt = part_of(tid);
    pt[0] = ml[ml_stride * tid];
    pt[1] = ml[ml_stride * tid + 1];
  }
}

// A split past the sequence's end: (max, sum) = (-inf, 0), which the combine skips.
template <int GRP, class PartOf>
__device__ __forceinline__ void write_empty_split(int tid, PartOf part_of) {
  if (tid < GRP) {
    float* pt = part_of(tid);
    pt[0] = -INFINITY;
    pt[1] = 0;
  }
}

template <int HD, int GRP>
constexpr int dec_shmem_floats() {
  constexpr int QF = 2 * (HD / 2) * 16, VF = (kDecChunk / (HD / 8)) * GRP * HD;
  return (QF > VF ? QF : VF) + GRP * kDecChunk + 2 * GRP;
}

template <class T, int BITS, int HD, int GRP>
__global__ void __launch_bounds__(kDecChunk) attend_kivi_dec_kernel(AttendKivi a1, const AttendKivi* as) {
  pdl_enter();
  const AttendKivi& a = as ? stage_params(as + blockIdx.z) : a1;
  constexpr int half = HD / 2, C = kDecChunk;
  constexpr int TPR = HD / 8, SL = C / TPR;  // V: threads per row (8 channels each), slot lanes
  constexpr int QF = 2 * half * 16, VF = SL * GRP * HD;
  extern __shared__ float sm[];
  float* qs = sm;                       // [2 runs][half][16] rotated queries (K phase)
  float* vred = sm;                     // [SL][GRP][HD] V partial sums (V phase, after qs is done)
  float* p = sm + (QF > VF ? QF : VF);  // [GRP][C] scores, then exp
  float* ml = p + GRP * C;              // [GRP][2] max, sum
  const KiviLayer& c = a.c;
  const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, S = gridDim.y;
  const int li = a.first + 1;  // slots the query sees
  const int b0 = s * C, b1 = min(b0 + C, li);
  const auto part_of = [&](int g) { return a.part + ((int64_t(h) * GRP + g) * S + s) * (HD + 2); };
  if (b0 >= b1) return write_empty_split<GRP>(tid, part_of);
  turn_queries<HD, GRP>(a, h, tid, qs);
  __syncthreads();
  const int ns = c.n_sink, qe = ns + c.n_quant;
  const KiviHeadRows<T> hr(c, h);
  const uint32_t* vpar = reinterpret_cast<const uint32_t*>(hr.vpar);  // (scale, zero) words
  {  // K: scores of slot t = b0 + tid
    const int t = b0 + tid;
    const auto row_of = [&](int jq) {
      return reinterpret_cast<const uint4*>(hr.kcodes + int64_t((c.qstart + jq) % c.cap) * c.row);
    };
    if (t < b1)
      slot_scores<T, BITS, HD, GRP, true>(a, hr, ns, qe, qs, reinterpret_cast<const float2*>(a.kcs), t, row_of, p + tid);
  }
  __syncthreads();
  const int len = b1 - b0, warp = tid >> 5, lane = tid & 31;
  for (int g = warp; g < GRP; g += C / 32) {  // one warp per head's softmax
    float m, l;
    warp_softmax_exp(p + g * C, len, lane, m, l);
    if (lane == 0) {
      ml[2 * g] = m;
      ml[2 * g + 1] = l;
    }
  }
  __syncthreads();
  // V: thread (cw, sl) takes channels cw*8.. of every SL-th slot.
  const int cw = tid % TPR, sl = tid / TPR;
  float o[GRP][8], bz[GRP];
#pragma unroll
  for (int g = 0; g < GRP; ++g) {
    bz[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[g][e] = 0.f;
  }
  for (int t = b0 + sl; t < b1; t += SL) {
    float pw[GRP];
#pragma unroll
    for (int g = 0; g < GRP; ++g) pw[g] = p[g * C + t - b0];
    if (t >= ns && t < qe) {
      const int prow = (c.qstart + t - ns) % c.cap;
      const float2 sz = par_f2(__ldg(vpar + prow));
      slot_values_quant<T, BITS, GRP, true>(sz, hr.vcodes + int64_t(prow) * c.row + cw * BITS, pw, o, bz);
    } else {
      slot_values_full<T, HD, GRP>(c, hr, ns, qe, t, cw, pw, o);
    }
  }
  // vred aliases qs: every thread finished the K phase before the softmax's barriers.
  write_split<HD, GRP>(vred, o, bz, tid, sl, cw, ml, 2, part_of);
}

// ---- The tiled decode kernel (kind 2; Session 14) ----
// The session-7 kernel above runs one 128-slot split per block. At 32K stored tokens
// (8B shape, int4) it reached 7.3% of the H200's bandwidth: a combine over 257 splits
// took a quarter of the time, each thread's V words arrived one dependent load after
// another with nothing else in flight, and every KV head's block read its slots' own
// slot-table columns (512 bytes per slot, 8x the int4 K codes, once per KV head).
// Here block (KV head h, split s, sequence) walks the split's tiles of C slots, one
// slot per thread as above, with
//  - an online softmax over the tiles (running max m, sum l; the V sums rescaled by
//    exp(m_old - m_new) per tile), so a split covers many tiles (plan.chunk = NT x C
//    slots) and the combine merges a few splits instead of hundreds;
//  - the next tile's K and V code rows and V (scale, zero) words copied to shared
//    memory (cp.async, two buffers) while the current tile is computed: every tile's
//    bytes are in flight together instead of one word per thread at a time;
//  - each slot turned by its own slot-table column, as kind 1 (Session 14 also tried
//    turning the tile's queries back by the tile start and every slot by column
//    t - b0, so that all blocks read the table's first columns: within 2% at 32K,
//    and not the CPU's fp32-rounded angles, so it was not kept).
// Measured (H200, int4, 8B shape's layer at 32K stored tokens, L2 cold): 98 us against
// kind 1's 126 (ncu: kernel 79 against 93 us, combine 15.7 against 33.9 us). The
// kernel is still bound by latency, not bandwidth: 168 registers leave 3 blocks (12
// warps) per SM, and each thread's 64 channel pairs run as one chain (docs/CUDA.md).
template <int R>  // code bytes per row -> shared-memory row stride (16-byte reads of 8 rows spread over the banks)
constexpr int code_stride() { return (R / 16 + 1) % 2 == 0 ? R + 32 : R + 16; }

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#else
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
#else
  *reinterpret_cast<uint32_t*>(dst) = *reinterpret_cast<const uint32_t*>(src);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Shared memory of attend_kivi_tile_kernel, in bytes (each part a multiple of 16).
template <int BITS, int HD, int GRP>
struct TileSmem {
  static constexpr int C = kDecChunk, R = HD * BITS / 8, RS = code_stride<R>();
  static constexpr int TPR = HD / 8, SL = C / TPR;  // V: threads per row (8 channels each), slot lanes
  static constexpr int kBuf = 2 * C * RS + C * 4;  // one tile: K rows, V rows [C][RS], V words [C]
  static constexpr int kVred = SL * GRP * HD * 4;  // [SL][GRP][HD] V sums, after the last tile
  static constexpr int kU = 2 * kBuf > kVred ? 2 * kBuf : kVred;
  static constexpr int kQs = 2 * (HD / 2) * 16 * 4;  // [2 runs][half][16] turned queries (rot_dot's layout)
  static constexpr int kP = GRP * C * 4;           // [GRP][C] scores, then exp
  static constexpr int kMl = GRP * 4 * 4;          // [GRP][4] running max, sum, this tile's rescale
  static constexpr int bytes = kU + kQs + kP + kMl;
};

// __launch_bounds__ without a blocks-per-SM minimum: the compiler takes 168 registers
// (head_dim 128, 4 heads per KV head). Session 14 measured the alternatives on the H200:
// a minimum of 4 (128 registers, spills) took 115 us at 32K against 98-103, and a minimum
// of 1 (243 registers) 103 us; batch 64 x 8K was not faster with either.
template <class T, int BITS, int HD, int GRP>
__global__ void __launch_bounds__(kDecChunk) attend_kivi_tile_kernel(AttendKivi a1, const AttendKivi* as, int chunk) {
  pdl_enter();
  using L = TileSmem<BITS, HD, GRP>;
  constexpr int half = HD / 2, C = kDecChunk, R = L::R, RS = L::RS, TPR = L::TPR, SL = L::SL;
  const AttendKivi& a = as ? stage_params(as + blockIdx.z) : a1;
  extern __shared__ __align__(16) unsigned char smb[];
  float* vred = reinterpret_cast<float*>(smb);  // aliases the tile buffers after the last tile
  float* qs = reinterpret_cast<float*>(smb + L::kU);
  float* p = qs + 2 * half * 16;
  float* ml = p + GRP * C;
  const KiviLayer& c = a.c;
  const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, S = gridDim.y;
  const int warp = tid >> 5, lane = tid & 31;
  const int li = a.first + 1;  // slots the query sees
  const int s0 = s * chunk, s1 = min(s0 + chunk, li);
  const auto part_of = [&](int g) { return a.part + ((int64_t(h) * GRP + g) * S + s) * (HD + 2); };
  if (s0 >= s1) return write_empty_split<GRP>(tid, part_of);
  const int ns = c.n_sink, qe = ns + c.n_quant;
  const KiviHeadRows<T> hr(c, h);
  // Tile [b0, b1)'s quantised rows (slots [max(b0, ns), min(b1, qe))) into buffer bi.
  const auto fetch = [&](int b0, int b1, int bi) {
    unsigned char* kb = smb + bi * L::kBuf;
    unsigned char* vb = kb + C * RS;
    unsigned char* pb = vb + C * RS;
    const int t0 = min(max(b0, ns), b1), n = min(max(b0, qe), b1) - t0;
    constexpr int P = R / 16;  // 16-byte pieces per row
    for (int e = tid; e < n * P; e += C) {
      const int r = e / P, pc = e % P, t = t0 + r;
      const int64_t prow = (c.qstart + t - ns) % c.cap;
      cp_async16(kb + (t - b0) * RS + pc * 16, hr.kcodes + prow * c.row + pc * 16);
      cp_async16(vb + (t - b0) * RS + pc * 16, hr.vcodes + prow * c.row + pc * 16);
    }
    for (int r = tid; r < n; r += C) {
      const int t = t0 + r;
      cp_async4(pb + (t - b0) * 4, hr.vpar + int64_t((c.qstart + t - ns) % c.cap) * 2);
    }
    cp_async_commit();
  };
  fetch(s0, min(s0 + C, s1), 0);
  turn_queries<HD, GRP>(a, h, tid, qs);
  if (tid < GRP) {
    ml[4 * tid] = -INFINITY;
    ml[4 * tid + 1] = 0.f;
  }
  const float2* kcs2 = reinterpret_cast<const float2*>(a.kcs);  // [hd/2, cap] (cos, sin)
  const int cw = tid % TPR, sl = tid / TPR;  // V: channels cw*8.., slots b0+sl, +SL, ...
  float o[GRP][8], bz[GRP];
#pragma unroll
  for (int g = 0; g < GRP; ++g) {
    bz[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[g][e] = 0.f;
  }
  __syncthreads();
  const int nt = (s1 - s0 + C - 1) / C;
  for (int it = 0; it < nt; ++it) {
    const int b0 = s0 + it * C, b1 = min(b0 + C, s1), len = b1 - b0;
    if (it + 1 < nt) {
      fetch(b0 + C, min(b0 + 2 * C, s1), (it + 1) & 1);
      cp_async_wait<1>();  // this tile's group has landed (the next one may be in flight)
    } else {
      cp_async_wait<0>();
    }
    const unsigned char* kb = smb + (it & 1) * L::kBuf;
    const unsigned char* vb = kb + C * RS;
    const uint32_t* pb = reinterpret_cast<const uint32_t*>(vb + C * RS);
    __syncthreads();  // every thread's copies are visible
    {  // K: scores of slot t = b0 + tid, its code row from the tile's copy
      const int t = b0 + tid;
      const auto row_of = [&](int) { return reinterpret_cast<const uint4*>(kb + tid * RS); };
      if (t < b1) slot_scores<T, BITS, HD, GRP, false>(a, hr, ns, qe, qs, kcs2, t, row_of, p + tid);
    }
    __syncthreads();
    for (int g = warp; g < GRP; g += C / 32) {  // one warp per head: the online softmax's step
      float* pg = p + g * C;
      float mt = -INFINITY;
      for (int j = lane; j < len; j += 32) mt = fmaxf(mt, pg[j]);
      mt = warp_max(mt);
      const float mo = ml[4 * g], mn = fmaxf(mo, mt);
      float l = 0.f;
      for (int j = lane; j < len; j += 32) {
        const float e = expf(pg[j] - mn);
        pg[j] = e;
        l += e;
      }
      l = warp_sum(l);
      __syncwarp();
      if (lane == 0) {
        const float al = expf(mo - mn);  // 0 on the first tile (mo = -inf)
        ml[4 * g] = mn;
        ml[4 * g + 1] = ml[4 * g + 1] * al + l;
        ml[4 * g + 2] = al;
      }
    }
    __syncthreads();
    {  // V: o <- o * alpha + sum_t p_t v_t (the scale folded into p, the zero into bz as kind 1)
#pragma unroll
      for (int g = 0; g < GRP; ++g) {
        const float al = ml[4 * g + 2];
        bz[g] *= al;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[g][e] *= al;
      }
      for (int t = b0 + sl; t < b1; t += SL) {
        float pw[GRP];
#pragma unroll
        for (int g = 0; g < GRP; ++g) pw[g] = p[g * C + t - b0];
        if (t >= ns && t < qe) {
          const float2 sz = par_f2(pb[t - b0]);
          slot_values_quant<T, BITS, GRP, false>(sz, vb + (t - b0) * RS + cw * BITS, pw, o, bz);
        } else {
          slot_values_full<T, HD, GRP>(c, hr, ns, qe, t, cw, pw, o);
        }
      }
    }
    __syncthreads();  // this tile's buffer and scores are used up before they are refilled
  }
  // vred aliases the tile buffers: no copy is pending (the last tile waited for all) and
  // every thread passed the loop's last barrier.
  write_split<HD, GRP>(vred, o, bz, tid, sl, cw, ml, 4, part_of);
}

template <class T>
__global__ void kivi_append_batch_kernel(const AppendKiviB* ps) {
  pdl_enter();
  const AppendKiviB& p = ps[blockIdx.x];
  const KiviLayer& c = p.c;
  const int h = blockIdx.y, hd = c.hd;
  const int64_t row = p.to_sink ? int64_t(h) * c.sink_cap + p.dst : int64_t(h) * c.res_cap + p.dst % c.res_cap;
  T* kd = static_cast<T*>(p.to_sink ? c.ksink : c.kres) + row * hd;
  T* vd = static_cast<T*>(p.to_sink ? c.vsink : c.vres) + row * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    kd[i] = narrow_resid<T>(p.k[h * hd + i]);
    vd[i] = narrow_resid<T>(p.v[h * hd + i]);
  }
}

}  // namespace

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
    launch(kivi_flush_k_kernel<T, BITS>, c.kvh, kth, 0, s, c, qdst, rsrc, gslot);
    launch(kivi_flush_v_kernel<T, BITS>, dim3(c.G, c.kvh), 128, 0, s, c, qdst, rsrc);
  }
};
template <class T, int BITS>
struct AttendKiviBatchLaunch {
  static void run(const AttendKivi* d, dim3 grid, int hpb, int chunk, size_t shmem, cudaStream_t s) {
    launch(attend_kivi_batch_kernel<T, BITS>, grid, kThreads, shmem, s, d, hpb, chunk);
  }
};
// The decode kernel for head_dim 64 / 128 and 1, 2, 4 or 8 query heads per KV head;
// false (nothing launched) for other shapes, which take attend_kivi_kernel.
template <class T, int BITS, int HD, int GRP>
void dec_launch(const AttendKivi& a, const AttendKivi* d, dim3 grid, const KiviDecPlan& plan, cudaStream_t s) {
  if (plan.kind == 2) {
    constexpr int bytes = TileSmem<BITS, HD, GRP>::bytes;  // up to ~96 KB (int8, head_dim 128, 8 heads per KV head)
    const auto go = [&](auto kernel) {
      static const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      (void)attr;  // a failure shows as the launch's error, which the caller checks
      launch(kernel, grid, kDecChunk, bytes, s, a, d, plan.chunk);
    };
    go(attend_kivi_tile_kernel<T, BITS, HD, GRP>);
    return;
  }
  const size_t shmem = size_t(dec_shmem_floats<HD, GRP>()) * sizeof(float);
  launch(attend_kivi_dec_kernel<T, BITS, HD, GRP>, grid, kDecChunk, shmem, s, a, d);
}
template <class T, int BITS>
struct AttendKiviDecLaunch {
  static void run(const AttendKivi& a, const AttendKivi* d, dim3 grid, int hd, int grp, const KiviDecPlan& plan,
                  bool& done, cudaStream_t s) {
    const auto by_grp = [&](auto hd_tag) {
      constexpr int HD = decltype(hd_tag)::value;
      if (grp == 1) dec_launch<T, BITS, HD, 1>(a, d, grid, plan, s);
      if (grp == 2) dec_launch<T, BITS, HD, 2>(a, d, grid, plan, s);
      if (grp == 4) dec_launch<T, BITS, HD, 4>(a, d, grid, plan, s);
      if (grp == 8) dec_launch<T, BITS, HD, 8>(a, d, grid, plan, s);
    };
    done = (hd == 64 || hd == 128) && (grp == 1 || grp == 2 || grp == 4 || grp == 8);
    if (!done) return;
    if (hd == 64) by_grp(std::integral_constant<int, 64>{});
    if (hd == 128) by_grp(std::integral_constant<int, 128>{});
  }
};
// Blocks of attend_kivi_tile_kernel one SM holds (registers and shared memory).
template <class T, int BITS>
struct TileResident {
  static void run(int hd, int grp, int& n) {
    const auto one = [&](auto kernel, int bytes) {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kDecChunk, size_t(bytes)) != cudaSuccess) n = 0;
    };
    const auto by_grp = [&](auto hd_tag) {
      constexpr int HD = decltype(hd_tag)::value;
      const auto g = [&](auto grp_tag) {
        constexpr int GRP = decltype(grp_tag)::value;
        one(attend_kivi_tile_kernel<T, BITS, HD, GRP>, TileSmem<BITS, HD, GRP>::bytes);
      };
      if (grp == 1) g(std::integral_constant<int, 1>{});
      if (grp == 2) g(std::integral_constant<int, 2>{});
      if (grp == 4) g(std::integral_constant<int, 4>{});
      if (grp == 8) g(std::integral_constant<int, 8>{});
    };
    if (hd == 64) by_grp(std::integral_constant<int, 64>{});
    if (hd == 128) by_grp(std::integral_constant<int, 128>{});
  }
};
template <class T, int BITS>
struct AttendKiviLaunch {
  static void run(const AttendKivi& a, dim3 grid, int hpb, int chunk, size_t shmem, cudaStream_t s) {
    launch(attend_kivi_kernel<T, BITS>, grid, kThreads, shmem, s, a, hpb, chunk);
  }
};

}  // namespace

int kivi_tile_blocks_per_sm(Elem re, int bits, int hd, int grp) {
  KiviLayer c;  // the dispatch keys
  c.re = re;
  c.bits = bits;
  int n = 0;
  kivi_dispatch<TileResident>(c, hd, grp, n);
  return n;
}

void kivi_append(const KiviLayer& c, const float* k, const float* v, int n, bool to_sink, int dst, cudaStream_t s) {
  if (n <= 0) return;
  const dim3 grid(n, c.kvh);
  if (c.re == Elem::F32) launch(kivi_append_kernel<float>, grid, 128, 0, s, c, k, v, to_sink, dst);
  if (c.re == Elem::F16) launch(kivi_append_kernel<__half>, grid, 128, 0, s, c, k, v, to_sink, dst);
  if (c.re == Elem::BF16) launch(kivi_append_kernel<__nv_bfloat16>, grid, 128, 0, s, c, k, v, to_sink, dst);
}

void kivi_flush(const KiviLayer& c, int qdst, int rsrc, int gslot, cudaStream_t s) {
  kivi_dispatch<FlushLaunch>(c, c, qdst, rsrc, gslot, s);
}

namespace {
// Heads per block: the largest divisor of the GQA group up to kMaxHpb (shared
// memory 4 * hpb * (2 hd + chunk + 2) bytes: <= 41 KB at hd 512).
// Only with enough splits (S >= 8): a short sequence has few blocks to spread
// over the GPU, and one head per block keeps them all (1B shape at depth 0:
// 64 blocks of 1 head instead of 16 of 4).
int heads_per_block(int grp, int S) {
  int hpb = 1;
  for (int d = kMaxHpb; d > 1 && S >= 8; --d)
    if (grp % d == 0) { hpb = d; break; }
  return hpb;
}
}  // namespace

void kivi_append_batch(const AppendKiviB* d, int B, int kvh, Elem re, cudaStream_t s) {
  const dim3 grid(B, kvh);
  if (re == Elem::F32) launch(kivi_append_batch_kernel<float>, grid, 128, 0, s, d);
  if (re == Elem::F16) launch(kivi_append_batch_kernel<__half>, grid, 128, 0, s, d);
  if (re == Elem::BF16) launch(kivi_append_batch_kernel<__nv_bfloat16>, grid, 128, 0, s, d);
}

void attend_kivi_batch(const AttendKivi* d, int B, int nh, int kvh, int hd, int S, const KiviDecPlan& plan, Elem re,
                       int bits, cudaStream_t s) {
  const int chunk = plan.chunk;
  if (plan.kind > 0) {
    KiviLayer c;  // the dispatch keys
    c.re = re;
    c.bits = bits;
    bool done = false;
    kivi_dispatch<AttendKiviDecLaunch>(c, AttendKivi{}, d, dim3(kvh, S, B), hd, nh / kvh, plan, done, s);
    launch(combine_batch_kernel<AttendKivi>, dim3(nh, B), 128, 0, s, d, S, hd);
    return;
  }
  const int hpb = heads_per_block(nh / kvh, S);
  const size_t shmem = size_t(hpb) * size_t(2 * hd + chunk + 2) * sizeof(float);
  const dim3 grid(nh / hpb, S, B);
  KiviLayer c;  // the dispatch keys
  c.re = re;
  c.bits = bits;
  kivi_dispatch<AttendKiviBatchLaunch>(c, d, grid, hpb, chunk, shmem, s);
  launch(combine_batch_kernel<AttendKivi>, dim3(nh, B), 128, 0, s, d, S, hd);
}

void attend_kivi(const AttendKivi& a, cudaStream_t s) {
  const KiviDecPlan plan = a.n == 1 ? kivi_dec_plan(a.c.hd, a.nh, a.c.kvh, a.c.re, a.c.bits, a.len, 1) : KiviDecPlan{};
  const int chunk = a.n == 1 ? plan.chunk : kivi_chunk(a.n);
  const int S = (a.len + chunk - 1) / chunk;
  const int grp = a.nh / a.c.kvh;
  if (plan.kind > 0) {
    const AttendKivi* none = nullptr;
    bool done = false;
    kivi_dispatch<AttendKiviDecLaunch>(a.c, a, none, dim3(a.c.kvh, S, 1), a.c.hd, grp, plan, done, s);
    combine(a.part, a.nh, S, a.c.hd, a.out, s);
    return;
  }
  const int hpb = heads_per_block(grp, S);
  const size_t shmem = size_t(hpb) * size_t(2 * a.c.hd + chunk + 2) * sizeof(float);
  const dim3 grid(a.nh / hpb, S, a.n);
  kivi_dispatch<AttendKiviLaunch>(a.c, a, grid, hpb, chunk, shmem, s);
  combine(a.part, a.n * a.nh, S, a.c.hd, a.out, s);
}

}  // namespace ptllm::cuda::k
