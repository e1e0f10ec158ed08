// arm64 quantised dot kernels (bodies: quant_neon.inc), in two builds:
//   namespace plain:   dot16 from SMULL/SMLAL (8 x i16 products) + SADALP
//   namespace dotprod: dot16 = SDOT (armv8.2 dotprod), under `#pragma GCC target("arch=armv8.2-a+dotprod")`
// The i16 products cannot overflow: a pair sum is at most 2 * 128 * 127 = 32512.
#include <arm_neon.h>

#include <cstring>
#include <type_traits>

#include "ops/quant_impl.h"

namespace ptllm::ops::q {

namespace plain {
namespace {
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
  int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  p = vmlal_high_s8(p, a, b);
  return vpadalq_s16(acc, p);
}
#include "ops/quant_neon.inc"
}  // namespace
}  // namespace plain

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
namespace dotprod {
namespace {
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
#include "ops/quant_neon.inc"
}  // namespace
}  // namespace dotprod
#pragma GCC pop_options

const Kernels& kernels_neon() { return plain::kTable; }
const Kernels& kernels_neon_dotprod() { return dotprod::kTable; }

}  // namespace ptllm::ops::q
