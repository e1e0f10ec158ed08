// Small x86 helpers shared by the SIMD kernels of src/ops (internal); every
// x86 kernel file includes this instead of <immintrin.h>.
#pragma once
#include <immintrin.h>

// GCC 12's own AVX-512 intrinsics headers trip these on _mm512_undefined_*()
// once inlined; the warnings are about the headers, not the kernels. (They
// hold for the rest of the including file, which is the point.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ptllm::ops::detail {

// Sum of the 8 lanes.
__attribute__((target("avx2,fma"), always_inline)) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace ptllm::ops::detail
