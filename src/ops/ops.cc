#include "ops/ops.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

// GCC 12's own AVX-512 intrinsics headers trip these on _mm512_undefined_*()
// once inlined; the warnings are about the headers, not this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ptllm::ops {
namespace {

// ---------- scalar reference ----------
float dot_f32_scalar(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
float dot_bf16_scalar(const uint16_t* w, const float* x, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
  return s;
}
float dot_f16_scalar(const uint16_t* w, const float* x, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += f16_to_f32(w[i]) * x[i];
  return s;
}

// ---------- AVX2 + FMA + F16C ----------
__attribute__((target("avx2,fma"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}
__attribute__((target("avx2,fma"))) float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
__attribute__((target("avx2,fma"))) inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2,fma"))) float dot_bf16_avx2(const uint16_t* w, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load_bf16x8(w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(x + i), s0);
  float s = hsum256(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
  return s;
}
__attribute__((target("avx2,fma,f16c"))) float dot_f16_avx2(const uint16_t* w, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 wf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    s0 = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), s0);
  }
  float s = hsum256(s0);
  for (; i < n; ++i) s += f16_to_f32(w[i]) * x[i];
  return s;
}

// ---------- AVX-512F ----------
__attribute__((target("avx512f"))) float dot_f32_avx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}
__attribute__((target("avx512f"))) inline __m512 load_bf16x16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"))) float dot_bf16_avx512(const uint16_t* w, const float* x, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(load_bf16x16(w + i), _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(load_bf16x16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(load_bf16x16(w + i), _mm512_loadu_ps(x + i), s0);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  for (; i < n; ++i) s += bf16_to_f32(w[i]) * x[i];
  return s;
}
__attribute__((target("avx512f"))) float dot_f16_avx512(const uint16_t* w, const float* x, int64_t n) {
  __m512 s0 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 wf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
    s0 = _mm512_fmadd_ps(wf, _mm512_loadu_ps(x + i), s0);
  }
  float s = _mm512_reduce_add_ps(s0);
  for (; i < n; ++i) s += f16_to_f32(w[i]) * x[i];
  return s;
}

struct Kernels {
  float (*dot_f32)(const float*, const float*, int64_t);
  float (*dot_bf16)(const uint16_t*, const float*, int64_t);
  float (*dot_f16)(const uint16_t*, const float*, int64_t);
};
constexpr Kernels kScalar{dot_f32_scalar, dot_bf16_scalar, dot_f16_scalar};
constexpr Kernels kAvx2{dot_f32_avx2, dot_bf16_avx2, dot_f16_avx2};
constexpr Kernels kAvx512{dot_f32_avx512, dot_bf16_avx512, dot_f16_avx512};

SimdLevel detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return SimdLevel::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return SimdLevel::Avx2;
  return SimdLevel::Scalar;
}

SimdLevel g_level = detect();
const Kernels* g_k = g_level == SimdLevel::Avx512 ? &kAvx512 : g_level == SimdLevel::Avx2 ? &kAvx2 : &kScalar;
int g_threads = 0;

}  // namespace

SimdLevel best_simd_level() {
  static const SimdLevel best = detect();
  return best;
}
SimdLevel simd_level() { return g_level; }
void set_simd_level(SimdLevel level) {
  if (int(level) > int(best_simd_level())) level = best_simd_level();
  g_level = level;
  g_k = level == SimdLevel::Avx512 ? &kAvx512 : level == SimdLevel::Avx2 ? &kAvx2 : &kScalar;
}
std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
  }
  return "?";
}

void set_num_threads(int n) {
  g_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(g_threads);
}
int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

float dot_f32(const float* a, const float* b, int64_t n) { return g_k->dot_f32(a, b, n); }

float dot_row(const void* row, DType dtype, const float* x, int64_t n) {
  switch (dtype) {
    case DType::F32: return g_k->dot_f32(static_cast<const float*>(row), x, n);
    case DType::BF16: return g_k->dot_bf16(static_cast<const uint16_t*>(row), x, n);
    case DType::F16: return g_k->dot_f16(static_cast<const uint16_t*>(row), x, n);
    default: fail("dot_row: unsupported weight dtype {}", dtype_name(dtype));
  }
}

void to_f32(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::F32:
      std::copy_n(static_cast<const float*>(src), n, dst);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    default: fail("to_f32: unsupported dtype {}", dtype_name(dtype));
  }
}

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

void silu_mul_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void softmax_scalar(float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = float(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void dot_rows_scalar(const float* q, const float* k, int64_t len, int64_t hd, float scale, float* scores) {
  for (int64_t t = 0; t < len; ++t) scores[t] = dot_f32(q, k + t * hd, hd) * scale;
}
void weighted_sum_rows_scalar(const float* p, const float* v, int64_t len, int64_t hd, float* out) {
  for (int64_t t = 0; t < len; ++t)
    if (p[t] != 0.f) axpy_scalar(p[t], v + t * hd, out, hd);
}

// ---------- AVX-512 kernels for matmul, exp, softmax, silu, axpy ----------
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

// Decode: y[o] = W[o, :] · x (+ bias[o]) for o in [r0, r1). Four rows at a
// time share each load of x, and their four horizontal sums overlap.
template <DType D>
void matvec_rows(const TensorView& w, const float* x, float* y, const TensorView* bias, int64_t r0, int64_t r1) {
  const int64_t in = w.cols();
  const size_t rb = storage_bytes(D, size_t(in));
  const int64_t in16 = in & ~int64_t(15);
  int64_t o = r0;
  for (; o + 4 <= r1; o += 4) {
    const std::byte* w0 = w.data + size_t(o) * rb;
    const std::byte *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int64_t i = 0; i < in16; i += 16) {
      const __m512 xv = _mm512_loadu_ps(x + i);
      a0 = _mm512_fmadd_ps(load16<D>(w0, i), xv, a0);
      a1 = _mm512_fmadd_ps(load16<D>(w1, i), xv, a1);
      a2 = _mm512_fmadd_ps(load16<D>(w2, i), xv, a2);
      a3 = _mm512_fmadd_ps(load16<D>(w3, i), xv, a3);
    }
    float s0 = _mm512_reduce_add_ps(a0), s1 = _mm512_reduce_add_ps(a1), s2 = _mm512_reduce_add_ps(a2),
          s3 = _mm512_reduce_add_ps(a3);
    for (int64_t i = in16; i < in; ++i) {
      s0 += load1<D>(w0, i) * x[i];
      s1 += load1<D>(w1, i) * x[i];
      s2 += load1<D>(w2, i) * x[i];
      s3 += load1<D>(w3, i) * x[i];
    }
    if (bias) {
      s0 += bias->at_f32(o);
      s1 += bias->at_f32(o + 1);
      s2 += bias->at_f32(o + 2);
      s3 += bias->at_f32(o + 3);
    }
    y[o] = s0;
    y[o + 1] = s1;
    y[o + 2] = s2;
    y[o + 3] = s3;
  }
  for (; o < r1; ++o) {
    const std::byte* w0 = w.data + size_t(o) * rb;
    __m512 a0 = _mm512_setzero_ps();
    for (int64_t i = 0; i < in16; i += 16) a0 = _mm512_fmadd_ps(load16<D>(w0, i), _mm512_loadu_ps(x + i), a0);
    float s0 = _mm512_reduce_add_ps(a0);
    for (int64_t i = in16; i < in; ++i) s0 += load1<D>(w0, i) * x[i];
    y[o] = s0 + (bias ? bias->at_f32(o) : 0.f);
  }
}

// Prefill: a blocked matmul. A panel of kNR weight rows is widened to fp32
// once, stored k-major ([in, kNR]) so one k step is two vector loads, and
// reused by every token; a kMR x kNR tile of outputs lives in 16 registers.
constexpr int kNR = 32;
constexpr int kMR = 8;

// panel[k * kNR + j] = W[o0 + j, k]; columns j >= nr are zero.
template <DType D>
void pack_panel(const TensorView& w, int64_t o0, int nr, float* panel) {
  const int64_t in = w.cols();
  const size_t rb = storage_bytes(D, size_t(in));
  alignas(64) float tmp[16];
  for (int j = 0; j < nr; ++j) {
    const std::byte* row = w.data + size_t(o0 + j) * rb;
    int64_t k = 0;
    for (; k + 16 <= in; k += 16) {
      _mm512_store_ps(tmp, load16<D>(row, k));
      for (int t = 0; t < 16; ++t) panel[(k + t) * kNR + j] = tmp[t];
    }
    for (; k < in; ++k) panel[k * kNR + j] = load1<D>(row, k);
  }
  for (int j = nr; j < kNR; ++j)
    for (int64_t k = 0; k < in; ++k) panel[k * kNR + j] = 0.f;
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

// e^x for 16 lanes: x = n·ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r
// (truncation < 1e-8 relative), scaled by 2^n. Inputs are clamped so -inf
// gives 0 and large x stays finite; within ~2 ulp of std::exp.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1); }

void silu_mul_avx512(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void softmax_avx512(float* x, int64_t n) {
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    mv = _mm512_mask_max_ps(mv, k, mv, _mm512_maskz_loadu_ps(k, x + i));
  }
  const float m = _mm512_reduce_max_ps(mv);
  if (!(m > -INFINITY) || !std::isfinite(m)) return softmax_scalar(x, n);  // all masked, or inf/NaN
  const __m512 mb = _mm512_set1_ps(m);
  // Sum in double, as the scalar reference does.
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mb)));
    _mm512_mask_storeu_ps(x + i, k, e);
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  const double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  const __m512 inv = _mm512_set1_ps(float(1.0 / s));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}

void axpy_avx512(float a, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k,
                          _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i)));
  }
}

// Lane j of the result = sum of the 16 lanes of a[j] (a transpose-and-add
// tree: 45 shuffles/adds instead of 16 separate horizontal reductions).
inline __m512 hsum16x16(__m512* a) {
  __m512 w[8];
  for (int j = 0; j < 8; ++j)
    w[j] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_ps(a[2 * j], a[2 * j + 1]));
  __m512 x[4];
  for (int j = 0; j < 4; ++j) {
    const __m512d l = _mm512_castps_pd(w[2 * j]), r = _mm512_castps_pd(w[2 * j + 1]);
    x[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(l, r)), _mm512_castpd_ps(_mm512_unpackhi_pd(l, r)));
  }
  // x[g]: 128-bit lane L holds keys 4g..4g+3's partial sums over columns of lane L.
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// hd = 16 * NC: 16 keys per step, their sums reduced together.
template <int NC>
void dot_rows_avx512(const float* q, const float* k, int64_t len, float scale, float* scores) {
  constexpr int64_t hd = 16 * NC;
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 qv[NC];
  for (int c = 0; c < NC; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  int64_t t = 0;
  for (; t + 16 <= len; t += 16) {
    __m512 acc[16];
    const float* kt = k + t * hd;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      acc[j] = _mm512_mul_ps(_mm512_loadu_ps(kt + j * hd), qv[0]);
#pragma GCC unroll 8
      for (int c = 1; c < NC; ++c) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(kt + j * hd + 16 * c), qv[c], acc[j]);
    }
    _mm512_storeu_ps(scores + t, _mm512_mul_ps(hsum16x16(acc), sc));
  }
  for (; t < len; ++t) {
    __m512 a = _mm512_setzero_ps();
    for (int c = 0; c < NC; ++c) a = _mm512_fmadd_ps(_mm512_loadu_ps(k + t * hd + 16 * c), qv[c], a);
    scores[t] = _mm512_reduce_add_ps(a) * scale;
  }
}

// hd = 16 * NC <= 128: the output row stays in registers, in S independent
// partial sums (keys t, t+1, ... round-robin) so the FMA latency overlaps.
template <int NC>
void weighted_sum_rows_avx512(const float* p, const float* v, int64_t len, float* out) {
  constexpr int64_t hd = 16 * NC;
  constexpr int S = NC <= 2 ? 4 : NC <= 4 ? 2 : 1;
  __m512 acc[S][NC];
  for (int c = 0; c < NC; ++c) acc[0][c] = _mm512_loadu_ps(out + 16 * c);
  for (int r = 1; r < S; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + S <= len; t += S) {
#pragma GCC unroll 4
    for (int r = 0; r < S; ++r) {
      // Masked keys have p == 0: skipped like the scalar reference (also keeps
      // a non-finite stale value out of the sum).
      const __m512 pt = _mm512_set1_ps(p[t + r]);
      const __mmask16 live = p[t + r] != 0.f ? __mmask16(0xffff) : __mmask16(0);
      const float* vt = v + (t + r) * hd;
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c)
        acc[r][c] = _mm512_mask3_fmadd_ps(pt, _mm512_maskz_loadu_ps(live, vt + 16 * c), acc[r][c], live);
    }
  }
  for (; t < len; ++t) {
    if (p[t] == 0.f) continue;
    const __m512 pt = _mm512_set1_ps(p[t]);
    for (int c = 0; c < NC; ++c) acc[0][c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + t * hd + 16 * c), acc[0][c]);
  }
  for (int c = 0; c < NC; ++c) {
    __m512 a = acc[0][c];
    for (int r = 1; r < S; ++r) a = _mm512_add_ps(a, acc[r][c]);
    _mm512_storeu_ps(out + 16 * c, a);
  }
}

#pragma GCC pop_options

bool fast_matmul(const TensorView& w) {
  return g_level == SimdLevel::Avx512 &&
         (w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16);
}

void matvec_rows_any(const TensorView& w, const float* x, float* y, const TensorView* bias, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::F32: return matvec_rows<DType::F32>(w, x, y, bias, r0, r1);
    case DType::BF16: return matvec_rows<DType::BF16>(w, x, y, bias, r0, r1);
    default: return matvec_rows<DType::F16>(w, x, y, bias, r0, r1);
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

// Per-thread panel scratch, grown on demand and kept between calls.
float* panel_scratch(int64_t in) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(in * kNR)) buf.resize(size_t(in * kNR));
  return buf.data();
}

// Multiply-adds at or above which a product is split across threads: below
// it the fork/join (a few microseconds) costs more than the arithmetic. Tiny
// models (stories260K: 64 x 64 weights) then run every matmul on one thread.
constexpr int64_t kParallelWork = int64_t(1) << 16;

// [begin, end) of `total` items for thread `tid` of `nt`, in units of `align`.
std::pair<int64_t, int64_t> split(int64_t total, int tid, int nt, int64_t align) {
  const int64_t units = (total + align - 1) / align;
  const int64_t b = units * tid / nt * align, e = units * (tid + 1) / nt * align;
  return {std::min(b, total), std::min(e, total)};
}

void check_matmul(const TensorView& w, const float* x, const float* y) {
  if (w.shape.size() != 2) fail("matmul: weight must be 2-D, got shape {}", shape_str(w.shape));
}

}  // namespace

void matmul_multi(const float* x, int64_t n_tokens, const MatmulJob* jobs, int n_jobs) {
  if (n_jobs <= 0 || n_tokens <= 0) return;
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
#pragma omp parallel if (total * in >= kParallelWork)
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
  // Prefill: one task per (job, panel of kNR rows).
  std::vector<std::pair<int, int64_t>> tasks;
  int64_t rows = 0;
  for (int j = 0; j < n_jobs; ++j) {
    rows += jobs[j].w->rows();
    for (int64_t o0 = 0; o0 < jobs[j].w->rows(); o0 += kNR) tasks.emplace_back(j, o0);
  }
#pragma omp parallel if (rows * in * n_tokens >= kParallelWork)
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
#pragma omp parallel if (2 * F * in >= kParallelWork)
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
  const int64_t n_panels = (F + kNR - 1) / kNR;
#pragma omp parallel if (2 * F * in * n_tokens >= kParallelWork)
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
    for (int64_t t = 0; t < n; ++t) {
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
#pragma omp parallel if (total * in * n_rows >= kParallelWork)
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

void rmsnorm(const float* x, const TensorView& weight, double eps, int64_t n, int64_t dim, float* out) {
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>(dim));
  to_f32(weight.data, weight.dtype, w.data(), dim);
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
    float* o = out + t * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[size_t(i)];
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  if (g_level == SimdLevel::Avx512) silu_mul_avx512(gate, up, n);
  else silu_mul_scalar(gate, up, n);
}

void softmax(float* x, int64_t n) {
  if (g_level == SimdLevel::Avx512) softmax_avx512(x, n);
  else softmax_scalar(x, n);
}

void dot_rows(const float* q, const float* k, int64_t len, int64_t hd, float scale, float* scores) {
  if (g_level == SimdLevel::Avx512) {
    switch (hd) {
      case 16: return dot_rows_avx512<1>(q, k, len, scale, scores);
      case 32: return dot_rows_avx512<2>(q, k, len, scale, scores);
      case 64: return dot_rows_avx512<4>(q, k, len, scale, scores);
      case 128: return dot_rows_avx512<8>(q, k, len, scale, scores);
      default: break;
    }
  }
  dot_rows_scalar(q, k, len, hd, scale, scores);
}

void weighted_sum_rows(const float* p, const float* v, int64_t len, int64_t hd, float* out) {
  if (g_level == SimdLevel::Avx512) {
    switch (hd) {
      case 16: return weighted_sum_rows_avx512<1>(p, v, len, out);
      case 32: return weighted_sum_rows_avx512<2>(p, v, len, out);
      case 64: return weighted_sum_rows_avx512<4>(p, v, len, out);
      case 128: return weighted_sum_rows_avx512<8>(p, v, len, out);
      default: break;
    }
  }
  weighted_sum_rows_scalar(p, v, len, hd, out);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  if (g_level == SimdLevel::Avx512) axpy_avx512(a, x, y, n);
  else axpy_scalar(a, x, y, n);
}

}  // namespace ptllm::ops
