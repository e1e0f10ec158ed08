// SIMD kernels against the scalar reference, per dtype.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/ops.h"
#include "ops/rope.h"
#include "test_util.h"

namespace ptllm {
namespace {

using test::randn;
using test::SimdGuard;

TEST(Dtype, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // ties to even -> 1.0
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Dtype, F16RoundTripIncludingSubnormalsAndOverflow) {
  for (float x : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.0009765625f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e-9f)), 0.f);
  // every finite f16 round-trips exactly through f32
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h);
}

// Per-dtype tolerance for a dot of length n against a double-precision sum:
// fp32 accumulation error grows ~ sqrt(n)·eps·sum|a·b|.
class DotTest : public ::testing::TestWithParam<std::tuple<ops::SimdLevel, DType, int>> {};

TEST_P(DotTest, MatchesScalarReference) {
  SimdGuard g;
  auto [level, dtype, n] = GetParam();
  auto x = randn(size_t(n), 1), wf = randn(size_t(n), 2);
  std::vector<uint16_t> w16(static_cast<size_t>(n));
  const void* row = wf.data();
  if (dtype == DType::BF16) {
    for (int i = 0; i < n; ++i) w16[size_t(i)] = f32_to_bf16(wf[size_t(i)]);
    row = w16.data();
  } else if (dtype == DType::F16) {
    for (int i = 0; i < n; ++i) w16[size_t(i)] = f32_to_f16(wf[size_t(i)]);
    row = w16.data();
  }
  ops::set_simd_level(ops::SimdLevel::Scalar);
  const float ref = ops::dot_row(row, dtype, x.data(), n);
  ops::set_simd_level(level);
  const float got = ops::dot_row(row, dtype, x.data(), n);
  double mag = 0;
  for (int i = 0; i < n; ++i) mag += std::fabs(double(wf[size_t(i)]) * x[size_t(i)]);
  EXPECT_NEAR(got, ref, 1e-6 * mag + 1e-6) << ops::simd_level_name(level);
}

INSTANTIATE_TEST_SUITE_P(AllLevels, DotTest,
                         ::testing::Combine(::testing::ValuesIn(ops::available_simd_levels()),
                                            ::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::Values(1, 7, 8, 31, 64, 257, 768)));

TEST(Matmul, BatchedEqualsRowByRow) {
  const int out = 37, in = 67, n = 5;
  auto wf = randn(size_t(out * in), 3), x = randn(size_t(n * in), 4);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  TensorView w{reinterpret_cast<const std::byte*>(wb.data()), DType::BF16, {out, in}};
  std::vector<float> y(size_t(n * out)), y1(static_cast<size_t>(out));
  ops::matmul(w, x.data(), n, y.data());
  for (int t = 0; t < n; ++t) {
    ops::matmul(w, x.data() + t * in, 1, y1.data());
    for (int o = 0; o < out; ++o) {
      double ref = 0;
      for (int i = 0; i < in; ++i) ref += double(bf16_to_f32(wb[size_t(o * in + i)])) * x[size_t(t * in + i)];
      EXPECT_NEAR(y[size_t(t * out + o)], ref, 1e-4);
      EXPECT_NEAR(y1[size_t(o)], ref, 1e-4);
    }
  }
}

// Weights of shape [out, in] stored as `dtype`, from fp32 values.
struct StoredMatrix {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  TensorView view;
  StoredMatrix(DType dtype, int64_t out, int64_t in, uint64_t seed) : f32(randn(size_t(out * in), seed)) {
    const void* data = f32.data();
    if (dtype != DType::F32) {
      u16.resize(f32.size());
      for (size_t i = 0; i < f32.size(); ++i) u16[i] = dtype == DType::BF16 ? f32_to_bf16(f32[i]) : f32_to_f16(f32[i]);
      data = u16.data();
    }
    view = TensorView{static_cast<const std::byte*>(data), dtype, {out, in}};
  }
};

// Blocked prefill GEMM and multi-row decode matvec against the scalar path,
// for every dtype, shapes that are not multiples of the SIMD/tile sizes, with
// and without bias. Tolerance: fp32 rounding of a length-`in` sum in a
// different order, 1e-5 · sum|w·x| (well above the ~sqrt(in)·6e-8 expected).
class MatmulTest : public ::testing::TestWithParam<std::tuple<DType, int, int, int, bool>> {};

TEST_P(MatmulTest, SimdMatchesScalar) {
  SimdGuard g;
  auto [dtype, out, in, n, with_bias] = GetParam();
  StoredMatrix w(dtype, out, in, 11);
  StoredMatrix b(DType::F32, 1, out, 12);
  TensorView bias{b.view.data, DType::F32, {out}};
  auto x = randn(size_t(n * in), 13);
  std::vector<float> ref(size_t(n * out)), got(size_t(n * out), NAN);
  ops::set_simd_level(ops::SimdLevel::Scalar);
  ops::matmul(w.view, x.data(), n, ref.data(), with_bias ? &bias : nullptr);
  ops::set_simd_level(ops::best_simd_level());
  ops::matmul(w.view, x.data(), n, got.data(), with_bias ? &bias : nullptr);
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < out; ++o) {
      double mag = 0;
      for (int i = 0; i < in; ++i) mag += std::fabs(double(w.view.at_f32(int64_t(o) * in + i)) * x[size_t(t * in + i)]);
      ASSERT_NEAR(got[size_t(t * out + o)], ref[size_t(t * out + o)], 1e-5 * mag + 1e-6)
          << "t=" << t << " o=" << o << " " << ops::simd_level_name(ops::simd_level());
    }
}

// matmul_rows (batched decode) must give each row exactly what the one-row
// decode product gives it, at every level, whatever the number of rows: the
// AVX-512 path runs 4 rows of x per pass over a weight block, then the rest
// one by one, so n from 1 to 9 covers both and their mix; `in` not a multiple
// of 16 covers the scalar tail, `out` not a multiple of 4 the leftover weight
// rows. Exact equality (no tolerance): batch invariance.
TEST(Matmul, RowsEqualOneRowDecodeBitForBit) {
  SimdGuard g;
  for (auto level : ops::available_simd_levels())
    for (DType dtype : {DType::F32, DType::F16, DType::BF16})
      for (int in : {16, 67, 256})
        for (int out : {5, 37, 64})
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(::testing::Message() << ops::simd_level_name(level) << " " << dtype_name(dtype) << " in " << in
                                              << " out " << out << " bias " << with_bias);
            ops::set_simd_level(level);
            StoredMatrix w(dtype, out, in, 21);
            StoredMatrix b(DType::F32, 1, out, 22);
            TensorView bias{b.view.data, DType::F32, {out}};
            const int n = 9;
            auto x = randn(size_t(n * in), 23);
            std::vector<float> one(size_t(n * out));
            for (int t = 0; t < n; ++t)
              ops::matmul(w.view, x.data() + t * in, 1, one.data() + t * out, with_bias ? &bias : nullptr);
            for (int rows = 1; rows <= n; ++rows) {
              std::vector<float> got(size_t(rows * out), NAN);
              const ops::MatmulJob job{&w.view, got.data(), with_bias ? &bias : nullptr};
              ops::matmul_rows(x.data(), rows, &job, 1);
              for (int i = 0; i < rows * out; ++i)
                ASSERT_EQ(got[size_t(i)], one[size_t(i)]) << "rows " << rows << " t " << i / out << " o " << i % out;
            }
          }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::Values(1, 5, 37, 64, 100),   // out rows
                                            ::testing::Values(7, 32, 67, 256),      // in
                                            ::testing::Values(1, 2, 9, 21, 33, 38), // tokens (> 32: the GEMM)
                                            ::testing::Bool()));

TEST(Matmul, MultiAndSwigluEqualSeparateCalls) {
  for (int n : {1, 6, 19}) {
    const int in = 96, F = 200;
    StoredMatrix wq(DType::BF16, 64, in, 21), wk(DType::BF16, 32, in, 22), wg(DType::BF16, F, in, 23),
        wu(DType::BF16, F, in, 24);
    auto x = randn(size_t(n * in), 25);
    std::vector<float> q(size_t(n * 64)), k(size_t(n * 32)), q1(q.size()), k1(k.size());
    ops::MatmulJob jobs[] = {{&wq.view, q.data(), nullptr}, {&wk.view, k.data(), nullptr}};
    ops::matmul_multi(x.data(), n, jobs, 2);
    ops::matmul(wq.view, x.data(), n, q1.data());
    ops::matmul(wk.view, x.data(), n, k1.data());
    EXPECT_EQ(q, q1);  // same kernel, same order: bit-identical
    EXPECT_EQ(k, k1);
    std::vector<float> g(size_t(n * F)), u(g.size()), g1(g.size()), u1(g.size());
    ops::matmul_swiglu(wg.view, wu.view, x.data(), n, g.data(), u.data());
    ops::matmul(wg.view, x.data(), n, g1.data());
    ops::matmul(wu.view, x.data(), n, u1.data());
    ops::silu_mul(g1.data(), u1.data(), n * F);
    EXPECT_EQ(g, g1) << n;
  }
}

// Vector exp-based kernels against the std::exp scalar reference. The SIMD
// exp is within a few ulp, so 1e-6 relative (+1e-30 absolute near 0).
// Sampling kernels (sample_kernels.cc). argmax at every level against a plain loop
// (first index on ties, NaNs never chosen); exp_weights bit for bit against the scalar
// level (weights and their sum: a seed must draw the same token on every machine), the
// sum against the weights added in the documented order, e^t within 2 ulp of std::exp.
TEST(Sampling, ArgmaxIsTheFirstLargestAtEveryLevel) {
  SimdGuard g;
  const auto plain = [](const std::vector<float>& x) {
    int64_t best = -1;
    for (size_t i = 0; i < x.size(); ++i)
      if (!std::isnan(x[i]) && (best < 0 || x[i] > x[size_t(best)])) best = int64_t(i);
    return best < 0 ? int64_t(0) : best;
  };
  std::mt19937 rng(5);
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    SCOPED_TRACE(ops::simd_level_name(lv));
    ops::set_simd_level(lv);
    for (int n : {1, 2, 7, 8, 15, 16, 17, 33, 100, 32000}) {
      for (int trial = 0; trial < 6; ++trial) {
        auto x = randn(size_t(n), uint32_t(100 * n + trial));
        // ties at the maximum (a coarse grid), NaNs, infinities, signed zeros
        if (trial == 1) for (float& v : x) v = std::round(v);
        if (trial == 2) for (size_t i = 0; i < x.size(); i += 3) x[i] = NAN;
        if (trial == 3) for (size_t i = 1; i < x.size(); i += 5) x[i] = -INFINITY;
        if (trial == 4) for (float& v : x) v = (rng() & 1) ? 0.f : -0.f;
        if (trial == 5) x[rng() % x.size()] = INFINITY;
        ASSERT_EQ(ops::argmax(x.data(), n), plain(x)) << "n " << n << " trial " << trial;
      }
    }
    std::vector<float> nan(40, NAN);
    EXPECT_EQ(ops::argmax(nan.data(), 40), 0);
  }
}

TEST(Sampling, ExpWeightsAreTheSameBitsAtEveryLevel) {
  SimdGuard g;
  for (int n : {1, 7, 8, 9, 15, 16, 17, 100, 4099, 32000}) {
    auto x = randn(size_t(n), uint32_t(n));
    for (float& v : x) v *= 4.f;
    if (n > 1) x[0] = -2000.f;  // a weight below e^-700: 0
    const double m = *std::max_element(x.begin(), x.end());
    std::vector<double> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    ops::set_simd_level(ops::SimdLevel::Scalar);
    const double total_ref = ops::exp_weights(x.data(), n, m, 1.25, ref.data());
    double part[8] = {};
    for (int i = 0; i < n; ++i) part[i % 8] += ref[size_t(i)];
    EXPECT_EQ(total_ref, ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])));
    if (n > 1) EXPECT_EQ(ref[0], 0.0);
    for (ops::SimdLevel lv : ops::available_simd_levels()) {
      SCOPED_TRACE(ops::simd_level_name(lv));
      ops::set_simd_level(lv);
      const double total = ops::exp_weights(x.data(), n, m, 1.25, got.data());
      EXPECT_EQ(total, total_ref) << "n " << n;
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), size_t(n) * sizeof(double)), 0) << "n " << n;
    }
  }
}

TEST(Sampling, ExpReferenceIsWithinTwoUlpOfLibm) {
  double worst = 0;
  for (int i = 0; i <= 200000; ++i) {
    const double t = -700.0 * i / 200000.0;
    const double want = std::exp(t), got = ops::exp_reference(t);
    worst = std::max(worst, std::fabs(got - want) / (std::nextafter(want, INFINITY) - want));
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(ops::exp_reference(0.0), 1.0);
  EXPECT_EQ(ops::exp_reference(-700.5), 0.0);
  EXPECT_EQ(ops::exp_reference(-INFINITY), 0.0);
  EXPECT_EQ(ops::exp_reference(NAN), 0.0);
  std::printf("exp_reference: worst %.2f ulp against std::exp over [-700, 0]\n", worst);
}

TEST(Elementwise, SimdSiluSoftmaxAxpyMatchScalar) {
  SimdGuard g;
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    SCOPED_TRACE(ops::simd_level_name(lv));
    for (int n : {1, 7, 8, 9, 15, 16, 17, 100, 768, 4099}) {
      auto a = randn(size_t(n), 31), b = randn(size_t(n), 32);
      for (int i = 0; i < n; i += 7) a[size_t(i)] *= 30.f;  // large |x|: exp saturates
      // silu_mul
      auto s_ref = a, s_got = a;
      ops::set_simd_level(ops::SimdLevel::Scalar);
      ops::silu_mul(s_ref.data(), b.data(), n);
      ops::set_simd_level(lv);
      ops::silu_mul(s_got.data(), b.data(), n);
      for (int i = 0; i < n; ++i)
        ASSERT_NEAR(s_got[size_t(i)], s_ref[size_t(i)], 1e-6 * std::fabs(s_ref[size_t(i)]) + 1e-30) << i;
      // softmax, with some masked (-inf) entries
      auto m_ref = a;
      for (int i = 3; i < n; i += 5) m_ref[size_t(i)] = -INFINITY;
      auto m_got = m_ref;
      ops::set_simd_level(ops::SimdLevel::Scalar);
      ops::softmax(m_ref.data(), n);
      ops::set_simd_level(lv);
      ops::softmax(m_got.data(), n);
      for (int i = 0; i < n; ++i) ASSERT_NEAR(m_got[size_t(i)], m_ref[size_t(i)], 1e-6 * m_ref[size_t(i)] + 1e-30) << i;
      // axpy
      auto y_ref = b, y_got = b;
      ops::set_simd_level(ops::SimdLevel::Scalar);
      ops::axpy(0.37f, a.data(), y_ref.data(), n);
      ops::set_simd_level(lv);
      ops::axpy(0.37f, a.data(), y_got.data(), n);
      for (int i = 0; i < n; ++i)
        ASSERT_NEAR(y_got[size_t(i)], y_ref[size_t(i)], 1e-6 * (std::fabs(y_ref[size_t(i)]) + 1)) << i;
    }
  }
}

// An element's SiLU does not depend on its offset in the buffer (a batch's
// rows are one buffer): the bits of a row alone equal those inside a batch.
TEST(Elementwise, SiluIsPositionInvariant) {
  SimdGuard g;
  const int F = 171;  // not a multiple of 4, 8 or 16: rows straddle vector tails
  auto a = randn(size_t(3 * F), 61), b = randn(size_t(3 * F), 62);
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    ops::set_simd_level(lv);
    auto all = a;
    ops::silu_mul(all.data(), b.data(), 3 * F);
    for (int r = 0; r < 3; ++r) {
      std::vector<float> row(a.begin() + r * F, a.begin() + (r + 1) * F);
      ops::silu_mul(row.data(), b.data() + r * F, F);
      for (int i = 0; i < F; ++i)
        ASSERT_EQ(row[size_t(i)], all[size_t(r * F + i)]) << ops::simd_level_name(lv) << " row " << r << " i " << i;
    }
  }
}

// e^x in the subnormal and saturated ranges (softmax of widely spread scores):
// every level's softmax gives the reference's zeros and tiny values.
TEST(Elementwise, SoftmaxFarTailsMatchScalar) {
  SimdGuard g;
  std::vector<float> x;
  for (int i = 0; i < 40; ++i) x.push_back(-float(i) * 3.f);  // e^-117 ... subnormal and below
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    auto ref = x, got = x;
    ops::set_simd_level(ops::SimdLevel::Scalar);
    ops::softmax(ref.data(), int64_t(ref.size()));
    ops::set_simd_level(lv);
    ops::softmax(got.data(), int64_t(got.size()));
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(got[i], ref[i], 1e-6 * ref[i] + 1e-44) << ops::simd_level_name(lv) << " i=" << i;
  }
}

// Several queries' value sums over the same rows (StorageKVCache::attend's
// prefill path) must be each query's single sum bit for bit, at every level:
// different weights per query, masked (p == 0) keys in different places, a
// non-finite value row that only masked keys meet, 1..4 queries, head sizes
// with and without the multi-query kernel.
TEST(Attention, WeightedSumMultiEqualsSingleSumsBitForBit) {
  SimdGuard g;
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    ops::set_simd_level(lv);
    for (int hd : {8, 16, 32, 64, 128})
      for (int len : {1, 5, 17, 300})
        for (int m = 1; m <= ops::kMultiQueries; ++m)
          for (bool dense : {false, true}) {  // dense: 0s only in the first 16 keys (blocks without a mask)
            SCOPED_TRACE(fmt::format("{} hd={} len={} m={} dense={}", ops::simd_level_name(lv), hd, len, m, dense));
            auto v = randn(size_t(len * hd), 51);
            std::vector<std::vector<float>> p, o_one, o_multi;
            for (int j = 0; j < m; ++j) {
              p.push_back(randn(size_t(len), 60 + uint64_t(j)));
              for (int t = j % 3; t < (dense ? std::min(len, 16) : len); t += 3 + j) p.back()[size_t(t)] = 0.f;
              o_one.push_back(randn(size_t(hd), 70 + uint64_t(j)));
              o_multi.push_back(o_one.back());
            }
            if (len > 4) {  // row 4: +inf, met only with p == 0 (skipped by every query)
              v[size_t(4 * hd)] = INFINITY;
              for (int j = 0; j < m; ++j) p[size_t(j)][4] = 0.f;
            }
            const float* pp[ops::kMultiQueries];
            float* oo[ops::kMultiQueries];
            for (int j = 0; j < m; ++j) {
              ops::weighted_sum_rows(p[size_t(j)].data(), v.data(), len, hd, o_one[size_t(j)].data());
              pp[j] = p[size_t(j)].data();
              oo[j] = o_multi[size_t(j)].data();
            }
            ops::weighted_sum_rows_multi(pp, m, v.data(), len, hd, oo);
            for (int j = 0; j < m; ++j) {
              EXPECT_EQ(std::memcmp(o_one[size_t(j)].data(), o_multi[size_t(j)].data(), size_t(hd) * sizeof(float)), 0)
                  << "query " << j;
              for (float x : o_multi[size_t(j)]) ASSERT_TRUE(std::isfinite(x));
            }
          }
  }
}

// weighted_sum_rows_heads: each query over its own value rows (a decode step's
// heads), equal bit for bit to one weighted_sum_rows per query, at every SIMD
// level, with the same zeros and masked +inf row as above. A kernel that mixed
// up two queries' rows or p, or summed in another order, fails here.
TEST(Attention, WeightedSumHeadsEqualsSingleSumsBitForBit) {
  SimdGuard g;
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    ops::set_simd_level(lv);
    for (int hd : {8, 16, 32, 64, 128})
      for (int len : {1, 5, 17, 300})
        for (int m = 1; m <= ops::kMultiQueries; ++m)
          for (bool dense : {false, true}) {
            SCOPED_TRACE(fmt::format("{} hd={} len={} m={} dense={}", ops::simd_level_name(lv), hd, len, m, dense));
            std::vector<std::vector<float>> v, p, o_one, o_heads;
            for (int j = 0; j < m; ++j) {
              v.push_back(randn(size_t(len * hd), 151 + uint64_t(j)));
              p.push_back(randn(size_t(len), 160 + uint64_t(j)));
              for (int t = j % 3; t < (dense ? std::min(len, 16) : len); t += 3 + j) p.back()[size_t(t)] = 0.f;
              if (len > 4) {  // row 4 of each head: +inf, met only with p == 0
                v.back()[size_t(4 * hd)] = INFINITY;
                p.back()[4] = 0.f;
              }
              o_one.push_back(randn(size_t(hd), 170 + uint64_t(j)));
              o_heads.push_back(o_one.back());
            }
            const float* pp[ops::kMultiQueries];
            const float* vv[ops::kMultiQueries];
            float* oo[ops::kMultiQueries];
            for (int j = 0; j < m; ++j) {
              ops::weighted_sum_rows(p[size_t(j)].data(), v[size_t(j)].data(), len, hd, o_one[size_t(j)].data());
              pp[j] = p[size_t(j)].data();
              vv[j] = v[size_t(j)].data();
              oo[j] = o_heads[size_t(j)].data();
            }
            ops::weighted_sum_rows_heads(pp, vv, m, len, hd, oo);
            for (int j = 0; j < m; ++j) {
              EXPECT_EQ(std::memcmp(o_one[size_t(j)].data(), o_heads[size_t(j)].data(), size_t(hd) * sizeof(float)), 0)
                  << "query " << j;
              for (float x : o_heads[size_t(j)]) ASSERT_TRUE(std::isfinite(x));
            }
          }
  }
}

// Attention primitives against the scalar reference (per-key dot_f32 / axpy),
// head sizes with and without a SIMD path, lengths around the 16-key blocks.
// Tolerance: 1e-5 of the sum of |terms| (different summation order).
TEST(Attention, DotRowsAndWeightedSumMatchScalar) {
  SimdGuard g;
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    for (int hd : {8, 16, 32, 64, 48, 128}) {
      for (int len : {1, 3, 4, 5, 15, 16, 17, 40, 300}) {
        SCOPED_TRACE(fmt::format("{} hd={} len={}", ops::simd_level_name(lv), hd, len));
        auto q = randn(size_t(hd), 41), k = randn(size_t(len * hd), 42), v = randn(size_t(len * hd), 43);
        auto p = randn(size_t(len), 44);
        for (int t = 2; t < len; t += 3) p[size_t(t)] = 0.f;  // masked keys
        std::vector<float> s_ref(static_cast<size_t>(len)), s_got(static_cast<size_t>(len));
        auto o_ref = randn(size_t(hd), 45), o_got = o_ref;
        ops::set_simd_level(ops::SimdLevel::Scalar);
        ops::dot_rows(q.data(), k.data(), len, hd, 0.25f, s_ref.data());
        ops::weighted_sum_rows(p.data(), v.data(), len, hd, o_ref.data());
        ops::set_simd_level(lv);
        ops::dot_rows(q.data(), k.data(), len, hd, 0.25f, s_got.data());
        ops::weighted_sum_rows(p.data(), v.data(), len, hd, o_got.data());
        for (int t = 0; t < len; ++t) {
          double mag = 0;
          for (int c = 0; c < hd; ++c) mag += std::fabs(double(q[size_t(c)]) * k[size_t(t * hd + c)]) * 0.25;
          ASSERT_NEAR(s_got[size_t(t)], s_ref[size_t(t)], 1e-5 * mag) << "t=" << t;
        }
        for (int c = 0; c < hd; ++c) {
          double mag = 1;
          for (int t = 0; t < len; ++t) mag += std::fabs(double(p[size_t(t)]) * v[size_t(t * hd + c)]);
          ASSERT_NEAR(o_got[size_t(c)], o_ref[size_t(c)], 1e-5 * mag) << "c=" << c;
        }
        // Run invariance: a key scored inside a longer run gets the same bits as alone.
        if (len > 1) {
          float alone = 0;
          ops::dot_rows(q.data(), k.data() + (len - 1) * hd, 1, hd, 0.25f, &alone);
          EXPECT_EQ(alone, s_got[size_t(len - 1)]);
        }
      }
    }
  }
}

// Scores against transposed keys (prefill): every level gives the scalar
// reference's bits (each lane sums in d order: a product, then an FMA per d),
// from any first column of kt (a run that starts mid-block), for 1..4
// queries; and they agree with dot_rows on the same keys within 1e-5 of the
// sum of |terms| (another summation order). A query count outside 1..4 is a
// one-line error.
TEST(Attention, DotRowsTransposedIsTheReferenceAtEveryLevel) {
  SimdGuard g;
  for (int hd : {8, 24, 32, 64, 128})
    for (int len : {1, 5, 16, 17, 40, 300})
      for (int b : {0, 3}) {
        const int64_t ld = (len + b + 15) / 16 * 16 + 16;
        auto k = randn(size_t(len * hd), 81);  // [len, hd] rows
        std::vector<float> kt(size_t(hd * ld), 0.f);
        for (int t = 0; t < len; ++t)
          for (int d = 0; d < hd; ++d) kt[size_t(d * ld + b + t)] = k[size_t(t * hd + d)];
        for (int m = 1; m <= ops::kMultiQueries; ++m) {
          std::vector<std::vector<float>> q, ref;
          const float* qp[ops::kMultiQueries];
          float* sp[ops::kMultiQueries];
          for (int j = 0; j < m; ++j) {
            q.push_back(randn(size_t(hd), 90 + uint64_t(j)));
            ref.emplace_back(size_t(ld), 0.f);
            qp[j] = q.back().data();
            sp[j] = ref.back().data();
          }
          ops::set_simd_level(ops::SimdLevel::Scalar);
          ops::dot_rows_transposed(qp, m, kt.data() + b, ld, len, hd, 0.25f, sp);
          for (ops::SimdLevel lv : ops::available_simd_levels()) {
            SCOPED_TRACE(fmt::format("{} hd={} len={} first={} m={}", ops::simd_level_name(lv), hd, len, b, m));
            ops::set_simd_level(lv);
            std::vector<std::vector<float>> got(size_t(m), std::vector<float>(size_t(ld), 0.f));
            for (int j = 0; j < m; ++j) sp[j] = got[size_t(j)].data();
            ops::dot_rows_transposed(qp, m, kt.data() + b, ld, len, hd, 0.25f, sp);
            for (int j = 0; j < m; ++j) {
              EXPECT_EQ(std::memcmp(got[size_t(j)].data(), ref[size_t(j)].data(), size_t(len) * sizeof(float)), 0)
                  << "query " << j;
              std::vector<float> one(static_cast<size_t>(len));
              ops::dot_rows(qp[j], k.data(), len, hd, 0.25f, one.data());
              for (int t = 0; t < len; ++t) {
                double mag = 0;
                for (int d = 0; d < hd; ++d) mag += std::fabs(double(qp[j][d]) * k[size_t(t * hd + d)]) * 0.25;
                ASSERT_NEAR(got[size_t(j)][size_t(t)], one[size_t(t)], 1e-5 * mag) << "query " << j << " t=" << t;
              }
            }
          }
        }
      }
  for (int m : {0, ops::kMultiQueries + 1}) {
    float x = 0;
    const float* qp[8] = {&x, &x, &x, &x, &x, &x, &x, &x};
    float* sp[8] = {&x, &x, &x, &x, &x, &x, &x, &x};
    try {
      ops::dot_rows_transposed(qp, m, &x, 16, 1, 1, 1.f, sp);
      ADD_FAILURE() << "no error for " << m << " queries";
    } catch (const std::exception& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("queries"), std::string::npos) << e.what();
    }
  }
}

// RMSNorm at every level against the scalar reference, rows of sizes with and
// without a SIMD tail, fp32 and bf16 weights. The sum of squares is in double
// at every level (only its addition order differs), so 2e-7 relative (about
// one fp32 ulp of the result) + 1e-30.
TEST(Elementwise, RmsNormMatchesScalarAtEveryLevel) {
  SimdGuard g;
  for (int dim : {1, 3, 4, 17, 64, 768, 1001}) {
    const int n = 3;
    auto x = randn(size_t(n * dim), 51);
    for (int i = 0; i < n * dim; i += 9) x[size_t(i)] *= 100.f;
    StoredMatrix wf(DType::F32, 1, dim, 52), wb(DType::BF16, 1, dim, 53);
    for (const TensorView* w : {&wf.view, &wb.view}) {
      const TensorView wv{w->data, w->dtype, {dim}};
      std::vector<float> ref(size_t(n * dim)), got(ref.size());
      ops::set_simd_level(ops::SimdLevel::Scalar);
      ops::rmsnorm(x.data(), wv, 1e-5, n, dim, ref.data());
      for (ops::SimdLevel lv : ops::available_simd_levels()) {
        ops::set_simd_level(lv);
        ops::rmsnorm(x.data(), wv, 1e-5, n, dim, got.data());
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_NEAR(got[i], ref[i], 2e-7 * std::fabs(ref[i]) + 1e-30)
              << "dim=" << dim << " " << dtype_name(w->dtype) << " " << ops::simd_level_name(lv) << " i=" << i;
      }
    }
  }
}

TEST(Simd, LevelsAreOrderedAndSettable) {
  SimdGuard g;
  const auto levels = ops::available_simd_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), ops::SimdLevel::Scalar);
  EXPECT_EQ(levels.back(), ops::best_simd_level());
  for (ops::SimdLevel l : levels) {
    ops::set_simd_level(l);
    EXPECT_EQ(ops::simd_level(), l) << ops::simd_level_name(l);
  }
  std::printf("SIMD levels here:");
  for (ops::SimdLevel l : levels) std::printf(" %s", std::string(ops::simd_level_name(l)).c_str());
  std::printf(" (CPU: %s)\n", ops::cpu_features().c_str());
}

TEST(Softmax, AllMaskedStaysLikeScalar) {
  SimdGuard g;
  std::vector<float> x(20, -INFINITY), y = x;
  ops::set_simd_level(ops::SimdLevel::Scalar);
  ops::softmax(x.data(), 20);
  ops::set_simd_level(ops::best_simd_level());
  ops::softmax(y.data(), 20);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(std::isnan(x[size_t(i)]), std::isnan(y[size_t(i)]));
}

TEST(Rope, RotateHalfPairsIWithIPlusHalf) {
  RopeConfig rc;
  rc.theta = 10000;
  Rope rope(rc, 4);
  // Position 1: pairs (0,2) rotate by 1 rad, pairs (1,3) by 1/100 rad.
  float x[4] = {1, 0, 0, 0};
  rope.apply(x, 1, 1.0);
  EXPECT_NEAR(x[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(1.0), 1e-6);
  EXPECT_EQ(x[1], 0.f);
  // Rotation preserves the norm.
  auto v = randn(64, 5);
  double n0 = 0, n1 = 0;
  for (float f : v) n0 += f * f;
  Rope r64(rc, 64);
  r64.apply(v.data(), 1, 12345.0);
  for (float f : v) n1 += f * f;
  EXPECT_NEAR(n0, n1, 1e-3 * n0);
}

TEST(Softmax, StableForLargeInputs) {
  std::vector<float> x = {1000.f, 1000.f, -INFINITY};
  ops::softmax(x.data(), 3);
  EXPECT_FLOAT_EQ(x[0], 0.5f);
  EXPECT_FLOAT_EQ(x[2], 0.f);
}

}  // namespace
}  // namespace ptllm
