// Dispatch state (SIMD level, threads) and the row kernels every other op is
// built on: dot products of fp32 / fp16 / bf16 rows with fp32, and widening to
// fp32. Each has a scalar reference and AVX2 / AVX-512 variants (dispatch.h).
#include "ops/ops.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <strings.h>

#include <vector>

#include "core/error.h"
#include "ops/dispatch.h"
#include "ops/neon_kernels.h"
#include "ops/quant.h"

#if PTLLM_X86
#include "ops/simd_util.h"
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

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

#if PTLLM_X86
// ---------- AVX2 + FMA + F16C and AVX-512F ----------
// One template per ISA over the weight type: two accumulators over 2·L lanes
// a step, one more L-lane step, then a scalar tail. Loads widen 8 (AVX2) or 16
// (AVX-512) weights to fp32: bf16 by a 16-bit shift, fp16 by F16C.
struct RowF32 {
  using T = float;
  static float at(const float* p, int64_t i) { return p[i]; }
};
struct RowBF16 {
  using T = uint16_t;
  static float at(const uint16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
};
struct RowF16 {
  using T = uint16_t;
  static float at(const uint16_t* p, int64_t i) { return f16_to_f32(p[i]); }
};

__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(RowF32, const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(RowBF16, const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(RowF16, const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <class Row>
__attribute__((target("avx2,fma,f16c"))) float dot_avx2(const typename Row::T* w, const float* x, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(load8(Row{}, w + i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load8(Row{}, w + i + 8), _mm256_loadu_ps(x + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(Row{}, w + i), _mm256_loadu_ps(x + i), s0);
  float s = detail::hsum8(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += Row::at(w, i) * x[i];
  return s;
}

__attribute__((target("avx512f"))) inline __m512 load16(RowF32, const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 load16(RowBF16, const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"))) inline __m512 load16(RowF16, const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
template <class Row>
__attribute__((target("avx512f"))) float dot_avx512(const typename Row::T* w, const float* x, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(load16(Row{}, w + i), _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(load16(Row{}, w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
  }
  for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(load16(Row{}, w + i), _mm512_loadu_ps(x + i), s0);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
  for (; i < n; ++i) s += Row::at(w, i) * x[i];
  return s;
}

#endif  // PTLLM_X86

// fp16 -> fp32 (fp16 K/V read back every step, fp16 weights and norms).
void widen_f16_scalar(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
#if PTLLM_X86
__attribute__((target("avx,f16c"))) void widen_f16_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  widen_f16_scalar(src + i, dst + i, n - i);
}
#endif

// What the CPU offers, read once.
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, avx512f = false;  // x86
  bool neon = false, dotprod = false, i8mm = false, bf16 = false;  // arm64
};
#if defined(__APPLE__) && defined(__aarch64__)
bool sysctl_flag(const char* name) {
  int v = 0;
  size_t len = sizeof(v);
  return ::sysctlbyname(name, &v, &len, nullptr, 0) == 0 && v != 0;
}
#endif
CpuFeatures read_features() {
  CpuFeatures f;
#if PTLLM_X86
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
#elif defined(__aarch64__)
  f.neon = true;  // ASIMD is mandatory in AArch64
#if defined(__linux__)
  // Bits of the Linux arm64 hwcaps ABI (asm/hwcap.h): HWCAP_ASIMDDP = 1 << 20,
  // HWCAP2_I8MM = 1 << 13, HWCAP2_BF16 = 1 << 14.
  const unsigned long hw = ::getauxval(AT_HWCAP), hw2 = ::getauxval(AT_HWCAP2);
  f.dotprod = (hw >> 20) & 1;
  f.i8mm = (hw2 >> 13) & 1;
  f.bf16 = (hw2 >> 14) & 1;
#elif defined(__APPLE__)
  f.dotprod = sysctl_flag("hw.optional.arm.FEAT_DotProd");
  f.i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
  f.bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
#endif
#endif
  return f;
}
const CpuFeatures& features() {
  static const CpuFeatures f = read_features();
  return f;
}

SimdLevel detect() {
  const CpuFeatures& f = features();
  if (f.avx512f) return SimdLevel::Avx512;
  if (f.avx2 && f.fma && f.f16c) return SimdLevel::Avx2;
  if (f.neon && f.dotprod) return SimdLevel::NeonDotprod;
  if (f.neon) return SimdLevel::Neon;
  return SimdLevel::Scalar;
}

}  // namespace

namespace detail {
SimdLevel g_level = detect();
}  // namespace detail

namespace {
using detail::pick;

// The row kernels, picked once per level (they run per weight row).
struct RowKernels {
  float (*dot_f32)(const float*, const float*, int64_t);
  float (*dot_bf16)(const uint16_t*, const float*, int64_t);
  float (*dot_f16)(const uint16_t*, const float*, int64_t);
  void (*widen_f16)(const uint16_t*, float*, int64_t);
};
RowKernels pick_row_kernels() {
  return {pick(dot_f32_scalar, PTLLM_X86_FN(dot_avx2<RowF32>), PTLLM_X86_FN(dot_avx512<RowF32>),
               PTLLM_NEON_FN(neon::dot_f32)),
          pick(dot_bf16_scalar, PTLLM_X86_FN(dot_avx2<RowBF16>), PTLLM_X86_FN(dot_avx512<RowBF16>),
               PTLLM_NEON_FN(neon::dot_bf16)),
          pick(dot_f16_scalar, PTLLM_X86_FN(dot_avx2<RowF16>), PTLLM_X86_FN(dot_avx512<RowF16>),
               PTLLM_NEON_FN(neon::dot_f16)),
          pick(widen_f16_scalar, PTLLM_X86_FN(widen_f16_f16c), PTLLM_X86_FN(widen_f16_f16c),
               PTLLM_NEON_FN(neon::widen_f16))};
}
RowKernels g_k = pick_row_kernels();
int g_threads = 0;

}  // namespace

SimdLevel best_simd_level() {
  static const SimdLevel best = detect();
  return best;
}
SimdLevel simd_level() { return detail::g_level; }
std::vector<SimdLevel> available_simd_levels() {
  const CpuFeatures& f = features();
  std::vector<SimdLevel> v{SimdLevel::Scalar};
  if (f.avx2 && f.fma && f.f16c) v.push_back(SimdLevel::Avx2);
  if (f.avx2 && f.fma && f.f16c && f.avx512f) v.push_back(SimdLevel::Avx512);
  if (f.neon) v.push_back(SimdLevel::Neon);
  if (f.neon && f.dotprod) v.push_back(SimdLevel::NeonDotprod);
  return v;
}
void set_simd_level(SimdLevel level) {
  SimdLevel use = SimdLevel::Scalar;
  for (SimdLevel l : available_simd_levels())
    if (int(l) <= int(level)) use = l;
  detail::g_level = use;
  g_k = pick_row_kernels();
}
std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar: return "scalar";
    case SimdLevel::Avx2: return "avx2";
    case SimdLevel::Avx512: return "avx512";
    case SimdLevel::Neon: return "neon";
    case SimdLevel::NeonDotprod: return "neon-dotprod";
  }
  return "?";
}
std::string cpu_features() {
  const CpuFeatures& f = features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.neon, "neon");
  add(f.dotprod, "dotprod");
  add(f.i8mm, "i8mm");
  add(f.bf16, "bf16");
  return s.empty() ? "none" : s;
}

// See parallel_min_work(). What a split costs depends on how libgomp's idle
// threads wait. Spinning (its default), a fork/join is a few microseconds
// and splitting pays from ~64K multiply-adds. Sleeping (OMP_WAIT_POLICY=
// passive, which main.cc picks on a busy machine), every parallel region is
// a futex wake-up of each other thread: measured on 2 cores with one served
// flagship-27m stream (docs/SERVER.md, "Latency, session 7"), 150-185 context
// switches and 4.9-7.2 ms of CPU per token at 64K, 6-9 and 2.9-3.3 ms at 1M
// (only the 8M-multiply-add lm_head split), 36-38 and 2.8-4.5 ms at 256K.
constexpr int64_t kSpinParallelMinWork = int64_t(1) << 16;
constexpr int64_t kPassiveParallelMinWork = int64_t(1) << 20;

bool omp_waits_passively() {
  const char* p = std::getenv("OMP_WAIT_POLICY");
  if (p && strcasecmp(p, "passive") == 0) return true;
  const char* c = std::getenv("GOMP_SPINCOUNT");
  return c && std::strtoll(c, nullptr, 10) == 0 && c[0] == '0';
}

void set_num_threads(int n) {
  g_threads = n > 0 ? n : omp_get_num_procs();
  omp_set_num_threads(g_threads);
}
int num_threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

int64_t parallel_min_work() {
  static const int64_t v = [] {
    int64_t d = omp_waits_passively() ? kPassiveParallelMinWork : kSpinParallelMinWork;
    if (const char* e = std::getenv("PTLLM_PARALLEL_MIN_WORK")) {
      char* end = nullptr;
      const long long n = std::strtoll(e, &end, 10);
      if (end != e && n >= 0) d = n;
    }
    return d;
  }();
  return v;
}

float dot_f32(const float* a, const float* b, int64_t n) { return g_k.dot_f32(a, b, n); }

float dot_row(const void* row, DType dtype, const float* x, int64_t n) {
  switch (dtype) {
    case DType::F32: return g_k.dot_f32(static_cast<const float*>(row), x, n);
    case DType::BF16: return g_k.dot_bf16(static_cast<const uint16_t*>(row), x, n);
    case DType::F16: return g_k.dot_f16(static_cast<const uint16_t*>(row), x, n);
    default:
      if (is_block_quantised(dtype)) return qdot_row_f32(dtype, row, x, n);
      fail("dot_row: unsupported weight dtype {}", dtype_name(dtype));
  }
}

void row_to_f32(const TensorView& w, int64_t r, float* dst) {
  if (w.shape.size() != 2) fail("row_to_f32: expected a 2-D weight, got shape {}", shape_str(w.shape));
  if (r < 0 || r >= w.rows()) fail("row_to_f32: row {} of a weight with {} rows", r, w.rows());
  const int64_t cols = w.cols();
  if (row_group(w.dtype) == 1) {
    to_f32(w.data + storage_bytes(w.dtype, size_t(r) * size_t(cols)), w.dtype, dst, cols);
    return;
  }
  // The row's blocks out of its group, then dequantised (a row of the 1B
  // shape's embedding is 2 KiB of Q4_0: a per-thread scratch, no allocation
  // per looked-up token).
  const DType base = rows16_base(w.dtype);
  const size_t rb = storage_bytes(base, size_t(cols));
  thread_local std::vector<std::byte> row;
  row.resize(rb);
  unpack_row16(w.dtype, w.data + size_t(r / 16) * 16 * rb, cols, int(r % 16), row.data());
  dequantize_row(base, row.data(), dst, cols);
}

void tensor_to_f32(const TensorView& w, float* dst) {
  if (row_group(w.dtype) == 1) return to_f32(w.data, w.dtype, dst, w.numel());
  for (int64_t r = 0; r < w.rows(); ++r) row_to_f32(w, r, dst + r * w.cols());
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
      g_k.widen_f16(static_cast<const uint16_t*>(src), dst, n);
      return;
    default:
      if (is_block_quantised(dtype)) return dequantize_row(dtype, src, dst, n);
      fail("to_f32: unsupported dtype {}", dtype_name(dtype));
  }
}

}  // namespace ptllm::ops
