// AVX2 (+FMA, F16C) quantised dot kernels: u8 x s8 products through maddubs
// (pairs -> i16) and madd (-> i32). Kernel bodies: quant_simd.inc.
#include <cstring>
#include <type_traits>

#include "ops/quant_impl.h"
#include "ops/simd_util.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace ptllm::ops::q {
namespace {

// No i16 overflow in maddubs: levels are <= 63 (Q8_0 uses |w| <= 128 against
// |x| <= 127), so a pair sum is at most 2 * 128 * 127 = 32512.
inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
inline __m256i dot_u8s8_w(__m256i acc, __m256i u, __m256i s, __m256i w16) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), w16));
}

#include "ops/quant_simd.inc"

}  // namespace

const Kernels& kernels_avx2() { return kTable; }

}  // namespace ptllm::ops::q

#pragma GCC pop_options
