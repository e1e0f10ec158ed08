// Scalar reference of the quantised dot products: the same integer arithmetic
// as the SIMD kernels (int8 activations times the stored levels, integer sums
// per block or super-block, one fp32 multiply-add per block), in plain C++.
#include <cstring>

#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/quant_impl.h"

namespace ptllm::ops::q {
namespace {

float h2f(uint16_t h) { return f16_to_f32(h); }

const A32* a32(const std::byte* xq, size_t xstride, int t) {
  return reinterpret_cast<const A32*>(xq + size_t(t) * xstride);
}
const A256* a256(const std::byte* xq, size_t xstride, int t) {
  return reinterpret_cast<const A256*>(xq + size_t(t) * xstride);
}

// Integer dot of 32 levels (weights) with 32 int8 activations.
int dot32(const uint8_t* lv, const int8_t* x) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += int(lv[j]) * int(x[j]);
  return s;
}

void dot_q8_0(const std::byte* w, const std::byte* xq, size_t xs, int64_t nb, int nt, float* out) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(w);
  for (int t = 0; t < nt; ++t) {
    const A32* x = a32(xq, xs, t);
    float acc = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      int s = 0;
      for (int j = 0; j < 32; ++j) s += int(b[i].qs[j]) * int(x[i].qs[j]);
      acc += h2f(b[i].d) * x[i].d * float(s);
    }
    out[t] = acc;
  }
}

// Q4_0/Q4_1/Q5_0/Q5_1: levels q in [0, 2^bits); x = d*q + m with m = -8d or
// -16d for the _0 types. sum = d*dx*sum(q*xq) + m*(dx*sum(xq)).
template <DType D, typename B>
void unpack_levels(const B& b, uint8_t* lv) {
  uint32_t qh = 0;
  if constexpr (D == DType::Q5_0 || D == DType::Q5_1) std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    lv[j] = uint8_t((b.qs[j] & 15) | ((qh >> j) & 1) << 4);
    lv[j + 16] = uint8_t((b.qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}
template <DType D, typename B>
void dot_small(const std::byte* w, const std::byte* xq, size_t xs, int64_t nb, int nt, float* out) {
  const auto* b = reinterpret_cast<const B*>(w);
  for (int t = 0; t < nt; ++t) {
    const A32* x = a32(xq, xs, t);
    float acc = 0.f, off = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t lv[32];
      unpack_levels<D>(b[i], lv);
      const float d = h2f(b[i].d);
      acc += d * x[i].d * float(dot32(lv, x[i].qs));
      if constexpr (D == DType::Q4_0) off += -8.f * d * x[i].s;
      else if constexpr (D == DType::Q5_0) off += -16.f * d * x[i].s;
      else off += h2f(b[i].m) * x[i].s;
    }
    out[t] = acc + off;
  }
}

// Q4_K/Q5_K: sum = d*dx*sum_s sc[s]*sum(q*xq) - dmin*dx*sum_s m[s]*bsum(s).
template <bool kFive, typename B>
void dot_k45(const std::byte* w, const std::byte* xq, size_t xs, int64_t nb, int nt, float* out) {
  const auto* b = reinterpret_cast<const B*>(w);
  for (int t = 0; t < nt; ++t) {
    const A256* x = a256(xq, xs, t);
    float acc = 0.f, off = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      uint8_t sc[8], m[8];
      k4_scales(b[i].scales, sc, m);
      int sumi = 0, summ = 0;
      for (int s = 0; s < 8; ++s) {
        const int c = s / 2, half = s % 2;
        uint8_t lv[32];
        for (int l = 0; l < 32; ++l) {
          int qv = half ? b[i].qs[32 * c + l] >> 4 : b[i].qs[32 * c + l] & 15;
          if constexpr (kFive) qv |= ((b[i].qh[l] >> s) & 1) << 4;
          lv[l] = uint8_t(qv);
        }
        sumi += int(sc[s]) * dot32(lv, x[i].qs + 32 * s);
        summ += int(m[s]) * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1]);
      }
      acc += h2f(b[i].d) * x[i].d * float(sumi);
      off += h2f(b[i].dmin) * x[i].d * float(summ);
    }
    out[t] = acc - off;
  }
}

// Q6_K: sum = d*dx*(sum_s sc[s]*sum(e*xq) - 32*sum_s sc[s]*bsum(s)), e in [0, 64).
void dot_q6_k(const std::byte* w, const std::byte* xq, size_t xs, int64_t nb, int nt, float* out) {
  const auto* b = reinterpret_cast<const BlockQ6_K*>(w);
  for (int t = 0; t < nt; ++t) {
    const A256* x = a256(xq, xs, t);
    float acc = 0.f, off = 0.f;
    for (int64_t i = 0; i < nb; ++i) {
      int sumi = 0, corr = 0;
      for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
        uint8_t e[128];
        for (int l = 0; l < 32; ++l) {
          e[l] = uint8_t((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
          e[l + 32] = uint8_t((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
          e[l + 64] = uint8_t((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
          e[l + 96] = uint8_t((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
        }
        for (int s = 0; s < 8; ++s) {
          int p = 0;
          for (int l = 0; l < 16; ++l) p += int(e[16 * s + l]) * int(x[i].qs[128 * h + 16 * s + l]);
          sumi += int(b[i].scales[8 * h + s]) * p;
          corr += int(b[i].scales[8 * h + s]) * x[i].bsums[8 * h + s];
        }
      }
      const float dd = h2f(b[i].d) * x[i].d;
      acc += dd * float(sumi);
      off += dd * float(32 * corr);
    }
    out[t] = acc - off;
  }
}

constexpr Kernels kScalar{quantize_act, {
    dot_q8_0,
    dot_small<DType::Q4_0, BlockQ4_0>,
    dot_small<DType::Q4_1, BlockQ4_1>,
    dot_small<DType::Q5_0, BlockQ5_0>,
    dot_small<DType::Q5_1, BlockQ5_1>,
    dot_k45<false, BlockQ4_K>,
    dot_k45<true, BlockQ5_K>,
    dot_q6_k,
}};

}  // namespace

const Kernels& kernels_scalar() { return kScalar; }

const Kernels& kernels() {
  return *detail::pick<const Kernels*>(&kScalar, PTLLM_X86_FN(&kernels_avx2()), PTLLM_X86_FN(&kernels_avx512()),
                                       PTLLM_NEON_FN(&kernels_neon()), PTLLM_NEON_FN(&kernels_neon_dotprod()));
}

}  // namespace ptllm::ops::q
