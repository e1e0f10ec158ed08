// The one dispatch mechanism of every SIMD kernel in the tree (internal to
// src/ops). A process-wide SIMD level is detected once from the CPU and can be
// forced down by set_simd_level() (tests compare each level with the scalar
// reference). A kernel lists its variants in ISA order and pick() returns the
// best one the level allows; a null variant (e.g. no AVX2 code for this
// head_dim) falls back to the next lower level, and the scalar reference is
// always there. Kernels called per element pick once per call (a switch, not
// per row); the dot kernels behind dot_row/dot_f32 are picked into a table
// whenever the level changes.
//
// Variants are compiled per function (`__attribute__((target(...)))` or a
// `#pragma GCC target` block), never with -march, so the library builds and
// runs on plain AVX2 and without SIMD.
//
// Architectures: x86 code (immintrin.h, target attributes) is compiled only
// where PTLLM_X86 is 1; NEON code (arm_neon.h, src/ops/*_neon.cc, which CMake
// adds only on aarch64) only where PTLLM_NEON is 1. A call site names its
// variants through PTLLM_X86_FN / PTLLM_NEON_FN, which are nullptr (= "no
// variant": the next lower level runs) on the other architecture, so no x86
// symbol is referenced on arm64 and vice versa.
#pragma once
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#define PTLLM_X86 1
#define PTLLM_X86_FN(f) f
#else
#define PTLLM_X86 0
#define PTLLM_X86_FN(f) nullptr
#endif
#if defined(__aarch64__)
#define PTLLM_NEON 1
#define PTLLM_NEON_FN(f) f
#else
#define PTLLM_NEON 0
#define PTLLM_NEON_FN(f) nullptr
#endif

#include "ops/ops.h"

namespace ptllm::ops::detail {

extern SimdLevel g_level;  // ops.cc: what is in use now
inline SimdLevel level() { return g_level; }

// x86 levels: Avx512 > Avx2 > Scalar. arm64 levels: NeonDotprod > Neon >
// Scalar (`neon` serves both unless a dotprod variant is given).
template <typename Fn>
inline Fn pick(Fn scalar, std::type_identity_t<Fn> avx2, std::type_identity_t<Fn> avx512,
               std::type_identity_t<Fn> neon = nullptr, std::type_identity_t<Fn> neon_dotprod = nullptr) {
  const SimdLevel l = g_level;
  switch (l) {
    case SimdLevel::Scalar: return scalar;
    case SimdLevel::Avx512:
      if (avx512) return avx512;
      [[fallthrough]];
    case SimdLevel::Avx2: return avx2 ? avx2 : scalar;
    case SimdLevel::NeonDotprod:
      if (neon_dotprod) return neon_dotprod;
      [[fallthrough]];
    case SimdLevel::Neon: return neon ? neon : scalar;
  }
  return scalar;
}

}  // namespace ptllm::ops::detail
