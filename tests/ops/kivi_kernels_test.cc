// Attention kernels over fp32 and packed KIVI rows (ops/kivi_kernels.h,
// ops::dot_rows*, ops::weighted_sum_rows, fp16 widening), at every SIMD level
// this CPU has, against a double-precision recomputation written here from the
// format's definition (kivi_format.h) and against the scalar level.
//
// Tolerance: fp32 accumulation error of a sum of m terms is ~ m * eps * sum|terms|;
// with m <= 256 (head_dim) and eps = 6e-8, 1e-5 * sum|terms| holds with margin
// while a wrong code, scale, sign or rotation shows up as O(1) * sum|terms|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/kivi_kernels.h"
#include "ops/ops.h"

namespace ptllm {
namespace {

using kivi::AffineParams;
using kivi::Half;
using kivi::QuantRange;

struct LevelGuard {
  ops::SimdLevel saved = ops::simd_level();
  ~LevelGuard() { ops::set_simd_level(saved); }
};

// Every level up to what this CPU has.
std::vector<ops::SimdLevel> levels() { return ops::available_simd_levels(); }

// Packs codes as kivi_format.h states: int4 element 2j in the low nibble of
// byte j, int2 element 4j+k in bits 2k..2k+1, int3 element i in bits
// 3i..3i+2 of the row read as one little-endian bit stream (bit by bit here).
void pack(const uint8_t* u, int64_t n, int bits, uint8_t* dst) {
  const size_t nb = kivi::row_bytes(n, QuantRange{0, 0, bits});
  for (size_t j = 0; j < nb; ++j) dst[j] = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (bits == 8) dst[i] = u[i];
    else if (bits == 4) dst[i / 2] = uint8_t(dst[i / 2] | (u[i] << (4 * (i & 1))));
    else if (bits == 3)
      for (int k = 0; k < 3; ++k) {
        const int64_t bit = 3 * i + k;
        if ((u[i] >> k) & 1) dst[bit / 8] = uint8_t(dst[bit / 8] | (1 << (bit % 8)));
      }
    else dst[i / 4] = uint8_t(dst[i / 4] | (u[i] << (2 * (i & 3))));
  }
}

QuantRange range_of(int bits) {
  return bits == 8 ? kivi::kInt8Range : bits == 4 ? kivi::kInt4Range : bits == 3 ? kivi::kInt3Range : kivi::kInt2Range;
}

// cap code rows of `hd` random codes, the unpacked codes kept for the reference.
struct CodeRing {
  int64_t hd, cap;
  QuantRange r;
  std::vector<uint8_t> u, packed;  // [cap, hd], [cap, row_bytes]
  CodeRing(int bits, int64_t hd_, int64_t cap_, uint64_t seed) : hd(hd_), cap(cap_), r(range_of(bits)) {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int> d(0, r.levels());
    u.resize(size_t(cap * hd));
    for (auto& x : u) x = uint8_t(d(g));
    const size_t rb = kivi::row_bytes(hd, r);
    packed.resize(size_t(cap) * rb);
    for (int64_t t = 0; t < cap; ++t) pack(&u[size_t(t * hd)], hd, bits, &packed[size_t(t) * rb]);
  }
  ops::KiviCodes view(int64_t start) const {
    ops::KiviCodes c;
    c.base = packed.data();
    c.row_bytes = kivi::row_bytes(hd, r);
    c.cap = cap;
    c.start = start;
    c.head_dim = hd;
    c.range = r;
    return c;
  }
};

std::vector<AffineParams> random_params(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> s(0.01f, 0.2f), z(-1.f, 1.f);
  std::vector<AffineParams> p(n);
  for (auto& x : p) x = {Half::nearest(s(g)), Half::nearest(z(g))};
  return p;
}

std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// cos/sin rows [n, hd/2] of random angles.
void angles(int64_t n, int64_t half, uint64_t seed, std::vector<float>& c, std::vector<float>& s) {
  const auto a = uniform(size_t(n * half), seed, -3.f, 3.f);
  c.resize(a.size());
  s.resize(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    c[i] = std::cos(a[i]);
    s[i] = std::sin(a[i]);
  }
}

// Double-precision scale * q . R k with k = [k_lo | k_hi] and rotation (c, s):
// k'_i = k_i c_i - k_{i+h} s_i, k'_{i+h} = k_{i+h} c_i + k_i s_i. `mag`: sum of |terms|.
double rotated_dot(const float* q, const double* k, int64_t hd, const float* c, const float* s, double scale,
                   double& mag) {
  const int64_t h = hd / 2;
  double acc = 0;
  mag = 0;
  for (int64_t i = 0; i < h; ++i) {
    const double lo = k[i] * c[i] - k[i + h] * s[i], hi = k[i + h] * c[i] + k[i] * s[i];
    acc += q[i] * lo + q[i + h] * hi;
    mag += std::fabs(q[i] * lo) + std::fabs(q[i + h] * hi) + std::fabs(q[i] * k[i]) + std::fabs(q[i + h] * k[i + h]);
  }
  return scale * acc;
}

// Head dims with SIMD variants (K: 32..256, V: 16..256) and ones without (24: the reference).
const int64_t kHeadDims[] = {16, 24, 32, 64, 128, 256};

TEST(KiviKernels, KeyScoresMatchDequantisedRotatedDotAtEveryLevel) {
  LevelGuard guard;
  for (int bits : {8, 4, 3, 2})
    for (int64_t hd : kHeadDims) {
      const int64_t cap = 40, start = 29, t0 = 5, n = 17;  // tokens 5..21 wrap past row 39
      const CodeRing ring(bits, hd, cap, uint64_t(bits * 1000 + hd));
      const auto params = random_params(size_t(hd), uint64_t(hd) + 7);  // one group: per channel
      const auto q = uniform(size_t(hd), 3);
      std::vector<float> kc, ks;
      angles(n, hd / 2, 11, kc, ks);
      const float scale = 0.3f;
      std::vector<double> ref(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (start + t0 + j) % cap;
        std::vector<double> k(static_cast<size_t>(hd));
        for (int64_t i = 0; i < hd; ++i)
          k[size_t(i)] = double(ring.u[size_t(row * hd + i)]) * params[size_t(i)].scale.widen() +
                         params[size_t(i)].zero.widen();
        ref[size_t(j)] =
            rotated_dot(q.data(), k.data(), hd, &kc[size_t(j * hd / 2)], &ks[size_t(j * hd / 2)], scale, mag[size_t(j)]);
      }
      std::vector<float> at_scalar;
      for (ops::SimdLevel l : levels()) {
        ops::set_simd_level(l);
        std::vector<float> got(static_cast<size_t>(n), NAN);
        ops::kivi_key_scores(ring.view(start), t0, n, params.data(), q.data(), scale, kc.data(), ks.data(),
                             got.data());
        if (l == ops::SimdLevel::Scalar) at_scalar = got;
        for (int64_t j = 0; j < n; ++j) {
          const double tol = 1e-5 * scale * mag[size_t(j)] + 1e-6;
          ASSERT_NEAR(got[size_t(j)], ref[size_t(j)], tol)
              << "int" << bits << " hd " << hd << " token " << j << " " << ops::simd_level_name(l);
          ASSERT_NEAR(got[size_t(j)], at_scalar[size_t(j)], tol) << "vs scalar, " << ops::simd_level_name(l);
        }
      }
    }
}

TEST(KiviKernels, ValueSumMatchesDequantisedSumAtEveryLevel) {
  LevelGuard guard;
  for (int bits : {8, 4, 3, 2})
    for (int64_t hd : kHeadDims) {
      const int64_t cap = 37, start = 30, t0 = 2, n = 21;
      const CodeRing ring(bits, hd, cap, uint64_t(bits * 77 + hd));
      const auto params = random_params(size_t(cap), uint64_t(hd) + 5);  // per token, by physical row
      auto p = uniform(size_t(n), 9, 0.f, 1.f);
      p[3] = 0.f;  // masked tokens are skipped
      p[10] = 0.f;
      const auto out0 = uniform(size_t(hd), 4);  // the kernel accumulates into out
      std::vector<double> ref(static_cast<size_t>(hd)), mag(static_cast<size_t>(hd));
      for (int64_t i = 0; i < hd; ++i) {
        ref[size_t(i)] = out0[size_t(i)];
        mag[size_t(i)] = std::fabs(out0[size_t(i)]);
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (start + t0 + j) % cap;
        const double s = params[size_t(row)].scale.widen(), z = params[size_t(row)].zero.widen();
        for (int64_t i = 0; i < hd; ++i) {
          const double v = double(ring.u[size_t(row * hd + i)]) * s + z;
          ref[size_t(i)] += p[size_t(j)] * v;
          mag[size_t(i)] += p[size_t(j)] * (std::fabs(double(ring.u[size_t(row * hd + i)]) * s) + std::fabs(z));
        }
      }
      std::vector<float> at_scalar;
      for (ops::SimdLevel l : levels()) {
        ops::set_simd_level(l);
        std::vector<float> got = out0;
        ops::kivi_value_sum(ring.view(start), t0, n, params.data(), p.data(), got.data());
        if (l == ops::SimdLevel::Scalar) at_scalar = got;
        for (int64_t i = 0; i < hd; ++i) {
          const double tol = 1e-5 * mag[size_t(i)] + 1e-6;
          ASSERT_NEAR(got[size_t(i)], ref[size_t(i)], tol)
              << "int" << bits << " hd " << hd << " channel " << i << " " << ops::simd_level_name(l);
          ASSERT_NEAR(got[size_t(i)], at_scalar[size_t(i)], tol) << "vs scalar, " << ops::simd_level_name(l);
        }
      }
    }
}

// Per-token keys (k_axis token, stored after RoPE, no turning):
// scores[j] = scale * q . (s_t u_t + z_t) against a double-precision
// dequantise-then-dot, at every level, in a ring that wraps; tolerance 1e-5 of
// the sum of |terms| (fp32 accumulation order differs between levels).
TEST(KiviKernels, PerTokenKeyScoresMatchDequantisedDotAtEveryLevel) {
  LevelGuard guard;
  for (int bits : {8, 4, 3, 2})
    for (int64_t hd : kHeadDims) {
      const int64_t cap = 41, start = 33, t0 = 3, n = 25;
      const CodeRing ring(bits, hd, cap, uint64_t(bits * 91 + hd));
      const auto params = random_params(size_t(cap), uint64_t(hd) + 17);
      const auto q = uniform(size_t(hd), 21);
      const double scale = 0.125;
      std::vector<double> ref(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = (start + t0 + j) % cap;
        const double sc = params[size_t(row)].scale.widen(), z = params[size_t(row)].zero.widen();
        for (int64_t i = 0; i < hd; ++i) {
          const double k = double(ring.u[size_t(row * hd + i)]) * sc + z;
          ref[size_t(j)] += scale * q[size_t(i)] * k;
          mag[size_t(j)] += scale * std::fabs(q[size_t(i)]) * (std::fabs(double(ring.u[size_t(row * hd + i)]) * sc) +
                                                              std::fabs(z));
        }
      }
      for (ops::SimdLevel l : levels()) {
        ops::set_simd_level(l);
        std::vector<float> got(static_cast<size_t>(n), 7.f);
        ops::kivi_key_scores_tokens(ring.view(start), t0, n, params.data(), q.data(), float(scale), got.data());
        for (int64_t j = 0; j < n; ++j)
          ASSERT_NEAR(got[size_t(j)], ref[size_t(j)], 1e-5 * mag[size_t(j)] + 1e-6)
              << "int" << bits << " hd " << hd << " token " << j << " " << ops::simd_level_name(l);
      }
    }
}

TEST(KiviKernels, EmptyRunsWriteNothing) {
  const CodeRing ring(4, 32, 8, 1);
  const auto params = random_params(32, 2);
  const auto q = uniform(32, 3);
  std::vector<float> scores(4, 7.f), out(32, 7.f), cs(64, 1.f), sn(64, 0.f);
  ops::kivi_key_scores(ring.view(0), 0, 0, params.data(), q.data(), 1.f, cs.data(), sn.data(), scores.data());
  ops::kivi_value_sum(ring.view(0), 0, 0, params.data(), q.data(), out.data());
  for (float s : scores) EXPECT_EQ(s, 7.f);
  for (float o : out) EXPECT_EQ(o, 7.f);
}

TEST(AttentionKernels, DotRowsRotatedMatchesRotatedDotAtEveryLevel) {
  LevelGuard guard;
  for (int64_t hd : {16, 24, 32, 64, 128}) {
    const int64_t n = 19;
    const auto q = uniform(size_t(hd), 1), k = uniform(size_t(n * hd), 2);
    std::vector<float> kc, ks;
    angles(n, hd / 2, 5, kc, ks);
    for (ops::SimdLevel l : levels()) {
      ops::set_simd_level(l);
      std::vector<float> got(static_cast<size_t>(n), NAN);
      ops::dot_rows_rotated(q.data(), k.data(), n, hd, kc.data(), ks.data(), 0.5f, got.data());
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> kd(k.begin() + t * hd, k.begin() + (t + 1) * hd);
        double mag;
        const double ref = rotated_dot(q.data(), kd.data(), hd, &kc[size_t(t * hd / 2)], &ks[size_t(t * hd / 2)], 0.5, mag);
        ASSERT_NEAR(got[size_t(t)], ref, 1e-5 * mag + 1e-6) << "hd " << hd << " row " << t << " "
                                                            << ops::simd_level_name(l);
      }
    }
  }
}

TEST(AttentionKernels, DotRowsAndWeightedSumAtEveryLevel) {
  LevelGuard guard;
  for (int64_t hd : {8, 16, 32, 64, 128}) {
    const int64_t len = 23;
    const auto q = uniform(size_t(hd), 1), k = uniform(size_t(len * hd), 2), v = uniform(size_t(len * hd), 3);
    auto p = uniform(size_t(len), 4, 0.f, 1.f);
    p[5] = 0.f;
    for (ops::SimdLevel l : levels()) {
      ops::set_simd_level(l);
      std::vector<float> s(static_cast<size_t>(len)), o(static_cast<size_t>(hd), 0.5f);
      ops::dot_rows(q.data(), k.data(), len, hd, 0.25f, s.data());
      ops::weighted_sum_rows(p.data(), v.data(), len, hd, o.data());
      for (int64_t t = 0; t < len; ++t) {
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < hd; ++i) {
          ref += double(q[size_t(i)]) * k[size_t(t * hd + i)];
          mag += std::fabs(double(q[size_t(i)]) * k[size_t(t * hd + i)]);
        }
        ASSERT_NEAR(s[size_t(t)], 0.25 * ref, 1e-5 * mag + 1e-6) << "hd " << hd << " " << ops::simd_level_name(l);
      }
      for (int64_t i = 0; i < hd; ++i) {
        double ref = 0.5, mag = 0.5;
        for (int64_t t = 0; t < len; ++t) {
          ref += double(p[size_t(t)]) * v[size_t(t * hd + i)];
          mag += std::fabs(double(p[size_t(t)]) * v[size_t(t * hd + i)]);
        }
        ASSERT_NEAR(o[size_t(i)], ref, 1e-5 * mag + 1e-6) << "hd " << hd << " " << ops::simd_level_name(l);
      }
    }
  }
}

// fp16 -> fp32 is exact, so every level must give the same bits (37: a tail
// after the 8-wide blocks; normals, subnormals, zeros, infinities).
TEST(AttentionKernels, F16WideningIsExactAtEveryLevel) {
  LevelGuard guard;
  std::vector<uint16_t> h;
  for (uint32_t b = 0; b < 0x10000; b += 1771) h.push_back(uint16_t(b));
  for (uint16_t b : {0x0000, 0x8000, 0x0001, 0x03ff, 0x7bff, 0x7c00, 0xfc00}) h.push_back(b);
  h.resize(h.size() / 8 * 8 + 5);
  for (ops::SimdLevel l : levels()) {
    ops::set_simd_level(l);
    std::vector<float> got(h.size());
    ops::to_f32(h.data(), DType::F16, got.data(), int64_t(h.size()));
    for (size_t i = 0; i < h.size(); ++i) {
      if ((h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x03ff)) continue;  // NaN payloads: not compared
      ASSERT_EQ(got[i], f16_to_f32(h[i])) << std::hex << h[i] << " " << ops::simd_level_name(l);
    }
  }
}

}  // namespace
}  // namespace ptllm
