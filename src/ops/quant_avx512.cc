// AVX-512 VNNI quantised dot kernels (256-bit vectors with AVX512VL): dpbusd
// does u8 x s8 -> i32 accumulate in one instruction, dpwssd the scaled i16
// pair sums of the K types. Kernel bodies: quant_simd.inc. CPUs with AVX-512F
// but without VNNI/VL/BW get the AVX2 kernels at this level.
#include <cstring>
#include <type_traits>

#include "ops/quant_impl.h"
#include "ops/simd_util.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")

namespace ptllm::ops::q {
namespace {

inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
inline __m256i dot_u8s8_w(__m256i acc, __m256i u, __m256i s, __m256i w16) {
  return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), w16);
}

#include "ops/quant_simd.inc"

}  // namespace
}  // namespace ptllm::ops::q

#pragma GCC pop_options

namespace ptllm::ops::q {

const Kernels& kernels_avx512() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
  }();
  return vnni ? kTable : kernels_avx2();
}

}  // namespace ptllm::ops::q
