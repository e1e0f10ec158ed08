// Q4_0_R16 (core/dtype.h): Q4_0 re-laid in 16-row groups for the AVX-512
// kernel. The layout is checked byte by byte against its definition, the
// products against Q4_0's at every ISA level (bit-identical: the AVX-512
// kernel does Q4_0's arithmetic on the same integers, the other levels unpack
// each group and run Q4_0's kernels), and the row readers against Q4_0's
// exact dequantisation.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "test_util.h"

namespace ptllm {
namespace {

using test::error_of;
using test::randn;
using test::SimdGuard;

// A random Q4_0 [rows, cols] weight and the same bytes re-laid.
struct Relaid {
  std::vector<std::byte> q4, r16;
  TensorView v_q4, v_r16;
  Relaid(int64_t rows, int64_t cols, uint64_t seed) {
    const auto w = randn(size_t(rows * cols), seed, 0.05f);
    q4.resize(ops::quantized_bytes(DType::Q4_0, rows, cols));
    ops::quantize_tensor(DType::Q4_0, w.data(), DType::F32, rows, cols, q4.data());
    r16 = q4;
    ops::pack_q4_0_rows16(r16.data(), rows, cols);
    v_q4 = TensorView{q4.data(), DType::Q4_0, {rows, cols}};
    v_r16 = TensorView{r16.data(), DType::Q4_0_R16, {rows, cols}};
  }
};

TEST(Q4_0R16, LayoutIsTheDefinitionAndUnpacksBack) {
  const int64_t rows = 48, cols = 96, nb = cols / 32;
  const Relaid w(rows, cols, 1);
  const size_t rb = size_t(nb) * 18;
  ASSERT_EQ(w.r16.size(), w.q4.size());
  for (int64_t g = 0; g < rows / 16; ++g)
    for (int64_t i = 0; i < nb; ++i) {
      const std::byte* rec = w.r16.data() + size_t(g) * 16 * rb + size_t(i) * 288;
      for (int r = 0; r < 16; ++r) {
        const std::byte* blk = w.q4.data() + size_t(g * 16 + r) * rb + size_t(i) * 18;
        ASSERT_EQ(std::memcmp(rec + 2 * r, blk, 2), 0) << "scale of row " << g * 16 + r << " block " << i;
        for (int k = 0; k < 4; ++k)
          ASSERT_EQ(std::memcmp(rec + 32 + 64 * k + 4 * r, blk + 2 + 4 * k, 4), 0)
              << "codes " << 4 * k << ".. of row " << g * 16 + r << " block " << i;
      }
    }
  std::vector<std::byte> back(16 * rb);
  for (int64_t g = 0; g < rows / 16; ++g) {
    ops::unpack_q4_0_rows16(w.r16.data() + size_t(g) * 16 * rb, cols, back.data());
    EXPECT_EQ(std::memcmp(back.data(), w.q4.data() + size_t(g) * 16 * rb, back.size()), 0) << "group " << g;
  }
}

TEST(Q4_0R16, RowAndTensorReadersEqualQ4_0Dequantisation) {
  const int64_t rows = 32, cols = 64;
  const Relaid w(rows, cols, 2);
  std::vector<float> ref(size_t(rows * cols)), got(ref.size()), row(static_cast<size_t>(cols));
  ops::to_f32(w.q4.data(), DType::Q4_0, ref.data(), rows * cols);
  ops::tensor_to_f32(w.v_r16, got.data());
  EXPECT_EQ(got, ref);
  for (int64_t r = 0; r < rows; ++r) {
    ops::row_to_f32(w.v_r16, r, row.data());
    EXPECT_EQ(row, std::vector<float>(ref.begin() + r * cols, ref.begin() + (r + 1) * cols))
        << "row " << r;
    std::vector<float> plain(static_cast<size_t>(cols));
    ops::row_to_f32(w.v_q4, r, plain.data());
    EXPECT_EQ(plain, row) << "row " << r;
  }
}

// Every product path (matmul, matmul_multi with a bias, matmul_swiglu,
// matmul_rows) over the re-laid weight equals the same call over the Q4_0
// bytes, bit for bit, at every level; token counts cover one token, a partial
// and a whole tile of 4 and more; 9 blocks per row (odd) and 64.
TEST(Q4_0R16, ProductsEqualQ4_0AtEveryLevel) {
  SimdGuard guard;
  for (int64_t cols : {int64_t(288), int64_t(2048)}) {
    const int64_t rows = 64;
    const Relaid w(rows, cols, 3), u(rows, cols, 4);
    const auto bias_f = randn(size_t(rows), 5);
    const TensorView bias{reinterpret_cast<const std::byte*>(bias_f.data()), DType::F32, {rows}};
    for (ops::SimdLevel lv : ops::available_simd_levels()) {
      ops::set_simd_level(lv);
      for (int64_t n : {1, 3, 4, 7}) {
        SCOPED_TRACE(::testing::Message() << ops::simd_level_name(lv) << " cols " << cols << " n " << n);
        const auto x = randn(size_t(n * cols), 6 + uint64_t(n));
        std::vector<float> a(size_t(n * rows)), b(a.size()), a2(a.size()), b2(a.size());
        ops::matmul(w.v_q4, x.data(), n, a.data());
        ops::matmul(w.v_r16, x.data(), n, b.data());
        EXPECT_EQ(a, b);
        const ops::MatmulJob ja[] = {{&w.v_q4, a.data(), &bias}, {&u.v_q4, a2.data(), nullptr}};
        const ops::MatmulJob jb[] = {{&w.v_r16, b.data(), &bias}, {&u.v_r16, b2.data(), nullptr}};
        ops::matmul_multi(x.data(), n, ja, 2);
        ops::matmul_multi(x.data(), n, jb, 2);
        EXPECT_EQ(a, b);
        EXPECT_EQ(a2, b2);
        ops::matmul_rows(x.data(), n, ja, 2);
        ops::matmul_rows(x.data(), n, jb, 2);
        EXPECT_EQ(a, b);
        EXPECT_EQ(a2, b2);
        ops::matmul_swiglu(w.v_q4, u.v_q4, x.data(), n, a.data(), a2.data());
        ops::matmul_swiglu(w.v_r16, u.v_r16, x.data(), n, b.data(), b2.data());
        EXPECT_EQ(a, b);
        // And the products are Q4_0's, not zeros: one row checked against
        // the dequantised weights within the activation rounding (loose).
        std::vector<float> wr(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
        ops::matmul(w.v_r16, x.data(), 1, y.data());
        ops::row_to_f32(w.v_r16, 5, wr.data());
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < cols; ++i) {
          ref += double(wr[size_t(i)]) * x[size_t(i)];
          mag += std::fabs(double(wr[size_t(i)]) * x[size_t(i)]);
        }
        EXPECT_NEAR(y[5], ref, 0.02 * mag);
      }
    }
  }
}

TEST(Q4_0R16, PaysOnlyWithTheKernel) {
  SimdGuard guard;
  ops::set_simd_level(ops::SimdLevel::Scalar);
  EXPECT_FALSE(ops::q4_0_rows16_pays());
  ops::set_simd_level(ops::best_simd_level());
  if (ops::simd_level() == ops::SimdLevel::Avx512) EXPECT_TRUE(ops::q4_0_rows16_pays());
}

TEST(Q4_0R16, BadShapesAndRowPointersAreOneLineErrors) {
  std::vector<std::byte> buf(ops::quantized_bytes(DType::Q4_0, 20, 64));
  EXPECT_NE(error_of([&] { ops::pack_q4_0_rows16(buf.data(), 20, 64); }).find("20 rows is not a multiple of 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::pack_q4_0_rows16(buf.data(), 16, 40); }).find("not a multiple of Q4_0's block"),
            std::string::npos);
  std::vector<float> out(64);
  EXPECT_NE(error_of([&] { ops::dequantize_row(DType::Q4_0_R16, buf.data(), out.data(), 64); }).find("groups of 16"),
            std::string::npos);
  const TensorView odd{buf.data(), DType::Q4_0_R16, {20, 64}};
  std::vector<float> x(64, 1.f), y(20);
  EXPECT_NE(error_of([&] { ops::matmul(odd, x.data(), 1, y.data()); }).find("not a multiple of its groups of 16"),
            std::string::npos);
  const Relaid w(16, 64, 7);
  EXPECT_NE(error_of([&] { ops::row_to_f32(w.v_r16, 16, out.data()); }).find("row 16 of a weight with 16 rows"),
            std::string::npos);
}

}  // namespace
}  // namespace ptllm
