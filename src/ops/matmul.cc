// matmul / matmul_multi / matmul_swiglu over F32/F16/BF16 weights. The
// generic path (dot_row per weight row: scalar or AVX2 dots) is the reference;
// at AVX-512 a 4-row matvec (decode) and a packed-panel blocked matmul
// (prefill) replace it.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "ops/quant.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

#if PTLLM_X86
#include "ops/simd_util.h"
#endif

namespace ptllm::ops {
namespace {

// ---------- generic matmul (scalar / AVX2 dots): the reference path ----------
void matmul_generic(const TensorView& w, const float* x, int64_t n_tokens, float* y, const TensorView* bias) {
  const int64_t out = w.rows(), in = w.cols();
  const size_t row_bytes = storage_bytes(w.dtype, size_t(in));
  const std::byte* base = w.data;
  std::vector<float> bias_f;
  if (bias) {
    bias_f.resize(size_t(out));
    to_f32(bias->data, bias->dtype, bias_f.data(), out);
  }
  const float* b = bias ? bias_f.data() : nullptr;
  if (n_tokens == 1) {
    // Decode: one pass over the weights, each row read once.
#pragma omp parallel for schedule(static) if (out >= 64)
    for (int64_t o = 0; o < out; ++o) y[o] = dot_row(base + size_t(o) * row_bytes, w.dtype, x, in) + (b ? b[o] : 0.f);
    return;
  }
  // Prefill: widen each weight row to fp32 once and reuse it for every token,
  // so the (larger) weight matrix is streamed once and x stays in cache.
#pragma omp parallel
  {
    std::vector<float> row(w.dtype == DType::F32 ? 0 : size_t(in));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      const float* r;
      if (w.dtype == DType::F32) {
        r = reinterpret_cast<const float*>(base + size_t(o) * row_bytes);
      } else {
        to_f32(base + size_t(o) * row_bytes, w.dtype, row.data(), in);
        r = row.data();
      }
      const float bo = b ? b[o] : 0.f;
      for (int64_t t = 0; t < n_tokens; ++t) y[t * out + o] = dot_f32(r, x + t * in, in) + bo;
    }
  }
}

// Prefill panel: kNR weight rows, a tile of kMR tokens (see gemm_panel).
constexpr int kNR = 32;
constexpr int kMR = 8;

#if PTLLM_X86
// ---------- AVX-512 kernels for matmul ----------
#pragma GCC push_options
#pragma GCC target("avx512f,fma,f16c")

// 16 consecutive stored elements of a row, widened to fp32.
template <DType D>
inline __m512 load16(const std::byte* row, int64_t i) {
  if constexpr (D == DType::F32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + i));
    if constexpr (D == DType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}
template <DType D>
inline float load1(const std::byte* row, int64_t i) {
  if constexpr (D == DType::F32) return reinterpret_cast<const float*>(row)[i];
  else if constexpr (D == DType::BF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  else return f16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
}

// The end of one (weight row o, x) dot product: `s`, the horizontal sum of
// the vector accumulator (detail::reduce16_tree's order; matvec_rows_x4 takes
// 16 at once through hsum16x16, the same order), the scalar tail [in16, in),
// then the bias. matvec_rows and matvec_rows_x4 both end every output here, so
// they give the same bits.
template <DType D>
inline float finish_row(float s, const std::byte* wrow, const float* x, int64_t in16, int64_t in,
                        const TensorView* bias, int64_t o) {
  for (int64_t i = in16; i < in; ++i) s += load1<D>(wrow, i) * x[i];
  if (bias) s += bias->at_f32(o);
  return s;
}

// Decode: y[o] = W[o, :] · x (+ bias[o]) for o in [r0, r1), one row at a
// time, one FMA chain per row. One token's pass does 1 FMA per 16 weights, so
// it is bound by the weight stream: rows run one after another (one
// sequential stream per thread, which the prefetchers follow; 4 rows
// interleaved measured 5-10% slower on the 1B shape), and software prefetch
// (detail::prefetch_stream, as the quantised kernels) runs ahead of it across
// page boundaries where the hardware prefetchers stop. Two accumulators per
// row instead of one chain measured no faster (session 21): the stream, not
// the FMA latency, is the bound.
template <DType D>
void matvec_rows(const TensorView& w, const float* x, float* y, const TensorView* bias, int64_t r0, int64_t r1) {
  const int64_t in = w.cols();
  const size_t rb = storage_bytes(D, size_t(in));
  const int64_t in16 = in & ~int64_t(15);
  constexpr int64_t kElemBytes = D == DType::F32 ? 4 : 2, kLine = 64 / kElemBytes;
  for (int64_t o = r0; o < r1; ++o) {
    const std::byte* wr = w.data + size_t(o) * rb;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + kLine <= in16; i += kLine) {
      detail::prefetch_stream(reinterpret_cast<const char*>(wr) + i * kElemBytes);
      for (int64_t k = 0; k < kLine; k += 16) acc = _mm512_fmadd_ps(load16<D>(wr, i + k), _mm512_loadu_ps(x + i + k), acc);
    }
    for (; i < in16; i += 16) acc = _mm512_fmadd_ps(load16<D>(wr, i), _mm512_loadu_ps(x + i), acc);
    y[o] = finish_row<D>(detail::reduce16_tree(acc), wr, x, in16, in, bias, o);
  }
}

// Batched decode: matvec_rows for 4 rows of x at once, x [4, in] -> y [4, out]
// (row stride `out`). Each weight vector is loaded (and widened) once for the
// four; each (weight row, x row) keeps its own accumulator with exactly
// matvec_rows's operations in its order (the same FMAs over i, then the same
// finish_row), so every output is bit-identical to
// matvec_rows of that x row alone: batch invariance (ops.h, matmul_rows).
template <DType D>
void matvec_rows_x4(const TensorView& w, const float* x, float* y, const TensorView* bias, int64_t r0, int64_t r1) {
  const int64_t in = w.cols(), out = w.rows();
  const size_t rb = storage_bytes(D, size_t(in));
  const int64_t in16 = in & ~int64_t(15);
  const float* xs[4] = {x, x + in, x + 2 * in, x + 3 * in};
  constexpr int64_t kElemBytes = D == DType::F32 ? 4 : 2;
  int64_t o = r0;
  for (; o + 4 <= r1; o += 4) {
    const std::byte* wr[4];
    for (int r = 0; r < 4; ++r) wr[r] = w.data + size_t(o + r) * rb;
    __m512 a[4][4];
    for (int r = 0; r < 4; ++r)
      for (int t = 0; t < 4; ++t) a[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < in16; i += 16) {
      // The first pass over a block (x rows 0..3) streams its weights from
      // memory: prefetch as matvec_rows does, each row's line once (rows are
      // contiguous, so that reaches a later group's rows). Later passes find
      // the block in L1 and these are no-ops.
      if ((i * kElemBytes) % 64 == 0)
        for (int r = 0; r < 4; ++r) detail::prefetch_stream(reinterpret_cast<const char*>(wr[r]) + i * kElemBytes);
      const __m512 w0 = load16<D>(wr[0], i), w1 = load16<D>(wr[1], i), w2 = load16<D>(wr[2], i),
                   w3 = load16<D>(wr[3], i);
      for (int t = 0; t < 4; ++t) {
        const __m512 xv = _mm512_loadu_ps(xs[t] + i);
        a[0][t] = _mm512_fmadd_ps(w0, xv, a[0][t]);
        a[1][t] = _mm512_fmadd_ps(w1, xv, a[1][t]);
        a[2][t] = _mm512_fmadd_ps(w2, xv, a[2][t]);
        a[3][t] = _mm512_fmadd_ps(w3, xv, a[3][t]);
      }
    }
    // The 16 sums in one tree (lane 4r + t = a[r][t]): at in = 256 the 16
    // separate reductions had cost half as many instructions as the FMAs.
    alignas(64) float sums[16];
    _mm512_store_ps(sums, detail::hsum16x16(&a[0][0]));
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 4; ++r)
        y[t * out + o + r] = finish_row<D>(sums[4 * r + t], wr[r], xs[t], in16, in, bias, o + r);
  }
  if (o < r1)
    for (int t = 0; t < 4; ++t) matvec_rows<D>(w, xs[t], y + t * out, bias, o, r1);
}

// Prefill: a blocked matmul. A panel of kNR weight rows is widened to fp32
// once, stored k-major ([in, kNR]) so one k step is two vector loads, and
// reused by every token; a kMR x kNR tile of outputs lives in 16 registers.

// a[t] <- column t of the 16 x 16 block whose row j is a[j] (a 16 x 16 fp32
// transpose in 64 shuffles: pairs of rows, then pairs of pairs within each
// 128-bit lane, then the 4 x 4 transpose of the 128-bit lanes).
inline void transpose16x16(__m512* a) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);      // lane L: r0[4L], r1[4L], r0[4L+1], r1[4L+1]
    t[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);  // lane L: r0[4L+2], r1[4L+2], r0[4L+3], r1[4L+3]
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + c], lane L: rows 4i..4i+3 of column 4L + c
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]),
                  t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {  // column 4L + c = lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 x0 = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 x1 = _mm512_shuffle_f32x4(u[c], u[4 + c], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 x2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 x3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], _MM_SHUFFLE(3, 2, 3, 2));
    a[c] = _mm512_shuffle_f32x4(x0, x2, _MM_SHUFFLE(2, 0, 2, 0));
    a[4 + c] = _mm512_shuffle_f32x4(x0, x2, _MM_SHUFFLE(3, 1, 3, 1));
    a[8 + c] = _mm512_shuffle_f32x4(x1, x3, _MM_SHUFFLE(2, 0, 2, 0));
    a[12 + c] = _mm512_shuffle_f32x4(x1, x3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// panel[k * kNR + j] = W[o0 + j, k]; columns j >= nr are zero. 16 rows x 16
// columns at a time through registers: the packing is a fixed cost per call
// that a short prompt does not amortise (flagship-27m bf16, 16 tokens: 52% of
// the prefill's samples when it stored one float at a time, session 21).
template <DType D>
void pack_panel(const TensorView& w, int64_t o0, int nr, float* panel) {
  const int64_t in = w.cols(), in16 = in & ~int64_t(15);
  const size_t rb = storage_bytes(D, size_t(in));
  for (int j0 = 0; j0 < kNR; j0 += 16) {
    const std::byte* row[16];
    for (int j = 0; j < 16; ++j) row[j] = j0 + j < nr ? w.data + size_t(o0 + j0 + j) * rb : nullptr;
    for (int64_t k = 0; k < in16; k += 16) {
      __m512 a[16];
      for (int j = 0; j < 16; ++j) a[j] = row[j] ? load16<D>(row[j], k) : _mm512_setzero_ps();
      transpose16x16(a);
      for (int t = 0; t < 16; ++t) _mm512_storeu_ps(panel + (k + t) * kNR + j0, a[t]);
    }
    for (int64_t k = in16; k < in; ++k)
      for (int j = 0; j < 16; ++j) panel[k * kNR + j0 + j] = row[j] ? load1<D>(row[j], k) : 0.f;
  }
}

// y[m, 0..nr) = x[m, :] · panel (+ bias) for m < M; x rows are ldx apart, y rows ldy.
template <int M>
void micro_tile(const float* panel, int64_t K, const float* x, int64_t ldx, float* y, int64_t ldy, __mmask16 m0,
                __mmask16 m1, __m512 b0, __m512 b1) {
  __m512 c0[M], c1[M];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) c0[m] = c1[m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m512 p0 = _mm512_loadu_ps(panel + k * kNR), p1 = _mm512_loadu_ps(panel + k * kNR + 16);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_set1_ps(x[m * ldx + k]);
      c0[m] = _mm512_fmadd_ps(a, p0, c0[m]);
      c1[m] = _mm512_fmadd_ps(a, p1, c1[m]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
    _mm512_mask_storeu_ps(y + m * ldy, m0, _mm512_add_ps(c0[m], b0));
    _mm512_mask_storeu_ps(y + m * ldy + 16, m1, _mm512_add_ps(c1[m], b1));
  }
}

// All tokens for weight rows [o0, o0 + nr), nr <= kNR; `panel` is scratch [in * kNR].
template <DType D>
void gemm_panel(const TensorView& w, const float* x, int64_t n, float* y, const TensorView* bias, int64_t o0,
                float* panel) {
  const int64_t out = w.rows(), in = w.cols();
  const int nr = int(std::min<int64_t>(kNR, out - o0));
  pack_panel<D>(w, o0, nr, panel);
  alignas(64) float bb[kNR] = {};
  if (bias)
    for (int j = 0; j < nr; ++j) bb[j] = bias->at_f32(o0 + j);
  const __m512 b0 = _mm512_load_ps(bb), b1 = _mm512_load_ps(bb + 16);
  const __mmask16 m0 = nr >= 16 ? __mmask16(0xffff) : __mmask16((1u << nr) - 1);
  const __mmask16 m1 = nr >= 32 ? __mmask16(0xffff) : nr > 16 ? __mmask16((1u << (nr - 16)) - 1) : __mmask16(0);
  float* yo = y + o0;
  int64_t t = 0;
  for (; t + kMR <= n; t += kMR) micro_tile<kMR>(panel, in, x + t * in, in, yo + t * out, out, m0, m1, b0, b1);
  const float* xt = x + t * in;
  float* yt = yo + t * out;
  switch (n - t) {
    case 1: micro_tile<1>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    case 2: micro_tile<2>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    case 3: micro_tile<3>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    case 4: micro_tile<4>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    case 5: micro_tile<5>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    case 6: micro_tile<6>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    case 7: micro_tile<7>(panel, in, xt, in, yt, out, m0, m1, b0, b1); break;
    default: break;
  }
}

#pragma GCC pop_options

bool fast_matmul(const TensorView& w) {
  return detail::level() == SimdLevel::Avx512 &&
         (w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16);
}

void matvec_rows_any(const TensorView& w, const float* x, float* y, const TensorView* bias, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::F32: return matvec_rows<DType::F32>(w, x, y, bias, r0, r1);
    case DType::BF16: return matvec_rows<DType::BF16>(w, x, y, bias, r0, r1);
    default: return matvec_rows<DType::F16>(w, x, y, bias, r0, r1);
  }
}
void matvec_rows_x4_any(const TensorView& w, const float* x, float* y, const TensorView* bias, int64_t r0,
                        int64_t r1) {
  switch (w.dtype) {
    case DType::F32: return matvec_rows_x4<DType::F32>(w, x, y, bias, r0, r1);
    case DType::BF16: return matvec_rows_x4<DType::BF16>(w, x, y, bias, r0, r1);
    default: return matvec_rows_x4<DType::F16>(w, x, y, bias, r0, r1);
  }
}
void gemm_panel_any(const TensorView& w, const float* x, int64_t n, float* y, const TensorView* bias, int64_t o0,
                    float* panel) {
  switch (w.dtype) {
    case DType::F32: return gemm_panel<DType::F32>(w, x, n, y, bias, o0, panel);
    case DType::BF16: return gemm_panel<DType::BF16>(w, x, n, y, bias, o0, panel);
    default: return gemm_panel<DType::F16>(w, x, n, y, bias, o0, panel);
  }
}
#else
// No blocked kernels on this architecture: every call takes matmul_generic
// (per-row dots, NEON on arm64), so these are never reached.
bool fast_matmul(const TensorView&) { return false; }
void matvec_rows_any(const TensorView&, const float*, float*, const TensorView*, int64_t, int64_t) {
  fail("matmul: no blocked matvec on this architecture");
}
void gemm_panel_any(const TensorView&, const float*, int64_t, float*, const TensorView*, int64_t, float*) {
  fail("matmul: no blocked gemm on this architecture");
}
void matvec_rows_x4_any(const TensorView&, const float*, float*, const TensorView*, int64_t, int64_t) {
  fail("matmul: no blocked matvec on this architecture");
}
#endif  // PTLLM_X86

// Per-thread panel scratch, grown on demand and kept between calls.
float* panel_scratch(int64_t in) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(in * kNR)) buf.resize(size_t(in * kNR));
  return buf.data();
}

// Multiply-adds at or above which a product is split across threads: below
// it the fork/join costs more than the arithmetic. Tiny models (stories260K:
// 64 x 64 weights) then run every matmul on one thread
// (ops::parallel_min_work()).

// [begin, end) of `total` items for thread `tid` of `nt`, in units of `align`.
std::pair<int64_t, int64_t> split(int64_t total, int tid, int nt, int64_t align) {
  const int64_t units = (total + align - 1) / align;
  const int64_t b = units * tid / nt * align, e = units * (tid + 1) / nt * align;
  return {std::min(b, total), std::min(e, total)};
}

// Products over at most this many tokens take the batched-decode kernel
// (matmul_rows: each 16-row weight block widened once per 4 tokens while it
// sits in L1) instead of the blocked GEMM, whose packing of every weight into
// fp32 panels is a fixed cost per call that few tokens do not amortise.
// flagship-27m bf16, 2 threads, `bench -p P -n 0`, old and new binary
// alternated (docs/BENCHMARKS.md, "Session 21"): P = 4: 862 -> 3,109
// tokens/s; P = 32: 2,007 -> 5,018 (4,376 -> 6,807 at -r 10); at 48-96 tokens
// the two paths came within 0.59-1.38 of each other, so the GEMM keeps those.
// PTLLM_ROWS_MAX=N moves the limit (0: every multi-token product through the
// GEMM), for A/B runs.
int64_t rows_max_tokens() {
  static const int64_t n = [] {
    const char* e = std::getenv("PTLLM_ROWS_MAX");
    return e && *e ? std::max<int64_t>(0, std::atoll(e)) : int64_t(32);
  }();
  return n;
}

void check_matmul(const TensorView& w, const float* x, const float* y) {
  if (w.shape.size() != 2) fail("matmul: weight must be 2-D, got shape {}", shape_str(w.shape));
}

}  // namespace

void matmul_multi(const float* x, int64_t n_tokens, const MatmulJob* jobs, int n_jobs) {
  if (n_jobs <= 0 || n_tokens <= 0) return;
  for (int j = 0; j < n_jobs; ++j)
    if (is_block_quantised(jobs[j].w->dtype)) return qmatmul_multi(x, n_tokens, jobs, n_jobs);
  int64_t in = jobs[0].w->cols();
  bool fast = true;
  for (int j = 0; j < n_jobs; ++j) {
    check_matmul(*jobs[j].w, x, jobs[j].y);
    if (jobs[j].w->cols() != in) fail("matmul_multi: weights disagree on the input size ({} vs {})", jobs[j].w->cols(), in);
    fast = fast && fast_matmul(*jobs[j].w);
  }
  if (!fast) {
    for (int j = 0; j < n_jobs; ++j) matmul_generic(*jobs[j].w, x, n_tokens, jobs[j].y, jobs[j].bias);
    return;
  }
  if (n_tokens == 1) {
    // Decode: the jobs' rows, concatenated, are split evenly across threads.
    int64_t total = 0;
    for (int j = 0; j < n_jobs; ++j) total += jobs[j].w->rows();
#pragma omp parallel if (total * in >= parallel_min_work())
    {
      auto [b, e] = split(total, omp_get_thread_num(), omp_get_num_threads(), 4);
      int64_t off = 0;
      for (int j = 0; j < n_jobs && off < e; ++j) {
        const int64_t rows = jobs[j].w->rows();
        const int64_t r0 = std::max(b - off, int64_t(0)), r1 = std::min(e - off, rows);
        if (r0 < r1) matvec_rows_any(*jobs[j].w, x, jobs[j].y, jobs[j].bias, r0, r1);
        off += rows;
      }
    }
    return;
  }
  if (n_tokens <= rows_max_tokens()) return matmul_rows(x, n_tokens, jobs, n_jobs);
  // Prefill: one task per (job, panel of kNR rows).
  std::vector<std::pair<int, int64_t>> tasks;
  int64_t rows = 0;
  for (int j = 0; j < n_jobs; ++j) {
    rows += jobs[j].w->rows();
    for (int64_t o0 = 0; o0 < jobs[j].w->rows(); o0 += kNR) tasks.emplace_back(j, o0);
  }
#pragma omp parallel if (rows * in * n_tokens >= parallel_min_work())
  {
    float* panel = panel_scratch(in);
#pragma omp for schedule(static)
    for (size_t i = 0; i < tasks.size(); ++i) {
      const MatmulJob& jb = jobs[tasks[i].first];
      gemm_panel_any(*jb.w, x, n_tokens, jb.y, jb.bias, tasks[i].second, panel);
    }
  }
}

void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, const TensorView* bias) {
  MatmulJob job{&w, y, bias};
  matmul_multi(x, n_tokens, &job, 1);
}

void matmul_swiglu(const TensorView& w_gate, const TensorView& w_up, const float* x, int64_t n_tokens, float* gate,
                   float* up) {
  if (w_gate.shape != w_up.shape)
    fail("matmul_swiglu: gate {} and up {} shapes differ", shape_str(w_gate.shape), shape_str(w_up.shape));
  if (n_tokens <= 0) return;
  if (is_block_quantised(w_gate.dtype) || is_block_quantised(w_up.dtype))
    return qmatmul_swiglu(w_gate, w_up, x, n_tokens, gate, up);
  const int64_t F = w_gate.rows(), in = w_gate.cols();
  if (!fast_matmul(w_gate) || !fast_matmul(w_up)) {
    matmul_generic(w_gate, x, n_tokens, gate, nullptr);
    matmul_generic(w_up, x, n_tokens, up, nullptr);
    silu_mul(gate, up, n_tokens * F);
    return;
  }
  if (n_tokens == 1) {
    // Each thread owns a range of ffn rows in both matrices, so the SwiGLU of
    // that range needs no barrier.
#pragma omp parallel if (2 * F * in >= parallel_min_work())
    {
      auto [b, e] = split(F, omp_get_thread_num(), omp_get_num_threads(), 16);
      if (b < e) {
        matvec_rows_any(w_gate, x, gate, nullptr, b, e);
        matvec_rows_any(w_up, x, up, nullptr, b, e);
        silu_mul(gate + b, up + b, e - b);
      }
    }
    return;
  }
  if (n_tokens <= rows_max_tokens()) return matmul_swiglu_rows(w_gate, w_up, x, n_tokens, gate, up);
  const int64_t n_panels = (F + kNR - 1) / kNR;
#pragma omp parallel if (2 * F * in * n_tokens >= parallel_min_work())
  {
    float* panel = panel_scratch(in);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < n_panels; ++p) {
      const int64_t o0 = p * kNR, nr = std::min<int64_t>(kNR, F - o0);
      gemm_panel_any(w_gate, x, n_tokens, gate, nullptr, o0, panel);
      gemm_panel_any(w_up, x, n_tokens, up, nullptr, o0, panel);
      for (int64_t t = 0; t < n_tokens; ++t) silu_mul(gate + t * F + o0, up + t * F + o0, nr);
    }
  }
}

// ---------- batched decode (matmul_rows): the decode arithmetic per row ----------
namespace {
// Weight rows per block: 16 rows of up to a few thousand inputs stay in L1
// while every row of x passes over them.
constexpr int64_t kRowBlock = 16;

// y[t, o] for t < n, o in [r0, r1): per row exactly what the n_tokens = 1 path
// computes (matvec_rows on AVX-512, dot_row + bias otherwise).
// `fast`: every job of the call has an AVX-512 kernel (as matmul_multi decides).
void rows_range(const TensorView& w, const float* x, int64_t n, float* y, const float* bias_f32,
                const TensorView* bias, int64_t r0, int64_t r1, bool fast) {
  const int64_t out = w.rows(), in = w.cols();
  const size_t row_bytes = storage_bytes(w.dtype, size_t(in));
  for (int64_t o0 = r0; o0 < r1; o0 += kRowBlock) {
    const int64_t o1 = std::min(o0 + kRowBlock, r1);
    int64_t t = 0;
    // Four rows of x share each load of the weight block (the block is in L1
    // either way; this saves the widening and the loads, not DRAM traffic).
    // PTLLM_NO_X4=1 turns it off, for A/B runs (docs/BENCHMARKS.md).
    static const bool no_x4 = std::getenv("PTLLM_NO_X4") != nullptr;
    if (fast && !no_x4)
      for (; t + 4 <= n; t += 4) matvec_rows_x4_any(w, x + t * in, y + t * out, bias, o0, o1);
    for (; t < n; ++t) {
      const float* xt = x + t * in;
      float* yt = y + t * out;
      if (fast) {
        matvec_rows_any(w, xt, yt, bias, o0, o1);
      } else {
        for (int64_t o = o0; o < o1; ++o)
          yt[o] = dot_row(w.data + size_t(o) * row_bytes, w.dtype, xt, in) + (bias_f32 ? bias_f32[o] : 0.f);
      }
    }
  }
}

std::vector<float> bias_to_f32(const TensorView* bias) {
  std::vector<float> b;
  if (bias) {
    b.resize(size_t(bias->numel()));
    to_f32(bias->data, bias->dtype, b.data(), int64_t(b.size()));
  }
  return b;
}
}  // namespace

void matmul_rows(const float* x, int64_t n_rows, const MatmulJob* jobs, int n_jobs) {
  if (n_jobs <= 0 || n_rows <= 0) return;
  // Block-quantised weights: their kernels already give each row the same
  // arithmetic whatever the number of rows (ops/quant.h).
  for (int j = 0; j < n_jobs; ++j)
    if (is_block_quantised(jobs[j].w->dtype)) return qmatmul_multi(x, n_rows, jobs, n_jobs);
  const int64_t in = jobs[0].w->cols();
  int64_t total = 0;
  bool fast = true;
  std::vector<std::vector<float>> biases;
  for (int j = 0; j < n_jobs; ++j) {
    fast = fast && fast_matmul(*jobs[j].w);
    check_matmul(*jobs[j].w, x, jobs[j].y);
    if (jobs[j].w->cols() != in) fail("matmul_rows: weights disagree on the input size ({} vs {})", jobs[j].w->cols(), in);
    total += jobs[j].w->rows();
    biases.push_back(bias_to_f32(jobs[j].bias));
  }
#pragma omp parallel if (total * in * n_rows >= parallel_min_work())
  {
    auto [b, e] = split(total, omp_get_thread_num(), omp_get_num_threads(), kRowBlock);
    int64_t off = 0;
    for (int j = 0; j < n_jobs && off < e; ++j) {
      const int64_t rows = jobs[j].w->rows();
      const int64_t r0 = std::max(b - off, int64_t(0)), r1 = std::min(e - off, rows);
      if (r0 < r1)
        rows_range(*jobs[j].w, x, n_rows, jobs[j].y, jobs[j].bias ? biases[size_t(j)].data() : nullptr, jobs[j].bias,
                   r0, r1, fast);
      off += rows;
    }
  }
}

void matmul_swiglu_rows(const TensorView& w_gate, const TensorView& w_up, const float* x, int64_t n_rows, float* gate,
                        float* up) {
  if (w_gate.shape != w_up.shape)
    fail("matmul_swiglu_rows: gate {} and up {} shapes differ", shape_str(w_gate.shape), shape_str(w_up.shape));
  if (n_rows <= 0) return;
  const MatmulJob jobs[] = {{&w_gate, gate, nullptr}, {&w_up, up, nullptr}};
  matmul_rows(x, n_rows, jobs, 2);
  silu_mul(gate, up, n_rows * w_gate.rows());  // elementwise: the same per element as the decode path
}

}  // namespace ptllm::ops
