// SIMD kernels against the scalar reference, per dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "ops/ops.h"
#include "ops/rope.h"

namespace ptllm {
namespace {

std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Restores the SIMD level after each test.
struct SimdGuard {
  ops::SimdLevel saved = ops::simd_level();
  ~SimdGuard() { ops::set_simd_level(saved); }
};

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
                         ::testing::Combine(::testing::Values(ops::SimdLevel::Scalar, ops::SimdLevel::Avx2,
                                                              ops::SimdLevel::Avx512),
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
