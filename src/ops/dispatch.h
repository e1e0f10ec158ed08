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
#pragma once
#include <type_traits>

#include "ops/ops.h"

namespace ptllm::ops::detail {

extern SimdLevel g_level;  // ops.cc: what is in use now
inline SimdLevel level() { return g_level; }

template <typename Fn>
inline Fn pick(Fn scalar, std::type_identity_t<Fn> avx2, std::type_identity_t<Fn> avx512) {
  const SimdLevel l = g_level;
  if (l == SimdLevel::Avx512 && avx512) return avx512;
  if (l != SimdLevel::Scalar && avx2) return avx2;
  return scalar;
}

}  // namespace ptllm::ops::detail
