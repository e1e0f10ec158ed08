// The _R16 layouts (core/dtype.h): Q8_0, Q4_0 and Q4_K re-laid in 16-row groups for
// the AVX-512 kernels. The layout is checked byte by byte against its
// definition (written out here, field by field), the products against the
// stored type's at every ISA level, and the row readers against the stored
// type's exact dequantisation.
//
// Tolerances: Q4_0_R16's kernel does Q4_0's arithmetic on the same integers,
// so its products equal Q4_0's bit for bit at every level. Q8_0_R16's and
// Q4_K_R16's sum the same exact integers per block but add the fp32 terms in
// another order than the 4-row tiles: within 1e-5 of sum |w x| (as the tiles
// themselves against the scalar path, quant_kernel_test.cc), and
// bit-identical at the levels without their kernel (they unpack and run the
// stored type's).
#include <gtest/gtest.h>

#include <cmath>
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

// A random [rows, cols] weight of stored type t and the same bytes re-laid.
struct Relaid {
  std::vector<std::byte> q, r16;
  TensorView v_q, v_r16;
  Relaid(DType t, int64_t rows, int64_t cols, uint64_t seed) {
    const auto w = randn(size_t(rows * cols), seed, 0.05f);
    q.resize(ops::quantized_bytes(t, rows, cols));
    ops::quantize_tensor(t, w.data(), DType::F32, rows, cols, q.data());
    r16 = q;
    ops::pack_rows16(t, r16.data(), rows, cols);
    v_q = TensorView{q.data(), t, {rows, cols}};
    v_r16 = TensorView{r16.data(), ops::rows16_type(t), {rows, cols}};
  }
};

struct FieldDef {
  int off, bytes;
};
struct TypeCase {
  DType t, r16;
  int64_t cols_small, cols_big;  // 9 blocks (odd) / 3 super-blocks, and 2048
  std::vector<FieldDef> fields;  // ggml's block fields, in record order
};
const std::vector<TypeCase>& cases() {
  static const std::vector<TypeCase> c = {
      {DType::Q8_0, DType::Q8_0_R16, 9 * 32, 2048, {{0, 2}, {2, 32}}},
      {DType::Q4_0, DType::Q4_0_R16, 9 * 32, 2048, {{0, 2}, {2, 16}}},
      {DType::Q4_K, DType::Q4_K_R16, 3 * 256, 2048, {{0, 2}, {2, 2}, {4, 12}, {16, 128}}},
  };
  return c;
}

TEST(Rows16, LayoutIsTheDefinitionAndUnpacksBack) {
  for (const TypeCase& tc : cases()) {
    SCOPED_TRACE(dtype_name(tc.t));
    EXPECT_EQ(ops::rows16_type(tc.t), tc.r16);
    EXPECT_EQ(ops::rows16_base(tc.r16), tc.t);
    EXPECT_EQ(ops::rows16_type(DType::Q6_K), DType::Q6_K);  // no 16-row layout
    const int64_t rows = 48, cols = tc.cols_small, nb = cols / int64_t(block_elems(tc.t));
    const Relaid w(tc.t, rows, cols, 1);
    const size_t bb = block_bytes(tc.t), rb = size_t(nb) * bb;
    ASSERT_EQ(w.r16.size(), w.q.size());
    for (int64_t g = 0; g < rows / 16; ++g)
      for (int64_t i = 0; i < nb; ++i) {
        const std::byte* rec = w.r16.data() + size_t(g) * 16 * rb + size_t(i) * 16 * bb;
        size_t at = 0;
        for (const FieldDef& f : tc.fields) {
          for (int r = 0; r < 16; ++r) {
            const std::byte* blk = w.q.data() + size_t(g * 16 + r) * rb + size_t(i) * bb + size_t(f.off);
            if (f.bytes == 2) {
              ASSERT_EQ(std::memcmp(rec + at + 2 * r, blk, 2), 0) << "field @" << f.off << " row " << r;
            } else {
              for (int j = 0; j < f.bytes / 4; ++j)
                ASSERT_EQ(std::memcmp(rec + at + 64 * j + 4 * r, blk + 4 * j, 4), 0)
                    << "field @" << f.off << " dword " << j << " row " << g * 16 + r << " block " << i;
            }
          }
          at += 16 * size_t(f.bytes);
        }
        ASSERT_EQ(at, 16 * bb);
      }
    std::vector<std::byte> back(16 * rb);
    for (int64_t g = 0; g < rows / 16; ++g) {
      ops::unpack_rows16(tc.r16, w.r16.data() + size_t(g) * 16 * rb, cols, back.data());
      EXPECT_EQ(std::memcmp(back.data(), w.q.data() + size_t(g) * 16 * rb, back.size()), 0) << "group " << g;
      // One row alone: the same bytes as that row of the whole group.
      std::vector<std::byte> one(rb);
      for (int r = 0; r < 16; ++r) {
        ops::unpack_row16(tc.r16, w.r16.data() + size_t(g) * 16 * rb, cols, r, one.data());
        EXPECT_EQ(std::memcmp(one.data(), w.q.data() + (size_t(g) * 16 + size_t(r)) * rb, rb), 0)
            << "group " << g << " row " << r;
      }
    }
  }
}

TEST(Rows16, RowAndTensorReadersEqualTheStoredTypesDequantisation) {
  for (const TypeCase& tc : cases()) {
    SCOPED_TRACE(dtype_name(tc.t));
    const int64_t rows = 32, cols = tc.cols_small;
    const Relaid w(tc.t, rows, cols, 2);
    std::vector<float> ref(size_t(rows * cols)), got(ref.size()), row(static_cast<size_t>(cols)),
        plain(static_cast<size_t>(cols));
    ops::to_f32(w.q.data(), tc.t, ref.data(), rows * cols);
    ops::tensor_to_f32(w.v_r16, got.data());
    EXPECT_EQ(got, ref);
    for (int64_t r = 0; r < rows; ++r) {
      ops::row_to_f32(w.v_r16, r, row.data());
      EXPECT_EQ(row, std::vector<float>(ref.begin() + r * cols, ref.begin() + (r + 1) * cols)) << "row " << r;
      ops::row_to_f32(w.v_q, r, plain.data());
      EXPECT_EQ(plain, row) << "row " << r;
    }
  }
}

// Every product path (matmul, matmul_multi with a bias, matmul_rows,
// matmul_swiglu) over the re-laid weight against the same call over the
// stored bytes at every level (the tolerance above); token counts cover one
// token, partial and whole tiles of 4 and 8, and more. And batch invariance: a
// row and token's result is the same whatever else is in the call.
TEST(Rows16, ProductsEqualTheStoredTypesAtEveryLevel) {
  SimdGuard guard;
  for (const TypeCase& tc : cases())
    for (int64_t cols : {tc.cols_small, tc.cols_big}) {
      const int64_t rows = 64;
      const Relaid w(tc.t, rows, cols, 3), u(tc.t, rows, cols, 4);
      std::vector<float> deq(size_t(rows * cols));
      ops::to_f32(w.q.data(), tc.t, deq.data(), rows * cols);
      const auto bias_f = randn(size_t(rows), 5);
      const TensorView bias{reinterpret_cast<const std::byte*>(bias_f.data()), DType::F32, {rows}};
      for (ops::SimdLevel lv : ops::available_simd_levels()) {
        ops::set_simd_level(lv);
        const bool exact = tc.t == DType::Q4_0 || !ops::rows16_pays(tc.t);
        const auto x = randn(size_t(11 * cols), 6);
        // |y - y_ref| bound for output o of token tk.
        const auto tol = [&](int64_t tk, int64_t o) {
          double mag = 0;
          for (int64_t i = 0; i < cols; ++i)
            mag += std::fabs(double(deq[size_t(o * cols + i)]) * x[size_t(tk * cols + i)]);
          return exact ? 0.0 : 1e-5 * mag;
        };
        const auto same = [&](const std::vector<float>& a, const std::vector<float>& b, int64_t n, const char* what) {
          for (int64_t tk = 0; tk < n; ++tk)
            for (int64_t o = 0; o < rows; ++o) {
              const size_t k = size_t(tk * rows + o);
              if (exact) ASSERT_EQ(a[k], b[k]) << what << " token " << tk << " row " << o;
              else ASSERT_NEAR(a[k], b[k], tol(tk, o)) << what << " token " << tk << " row " << o;
            }
        };
        // 11 tokens: a call of 8 (the 16-row kernels' most) and one of 3.
        std::vector<float> all11(size_t(11 * rows));
        ops::matmul(w.v_r16, x.data(), 11, all11.data());
        for (int64_t n : {1, 3, 4, 7, 8, 11}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(tc.t) << " " << ops::simd_level_name(lv) << " cols "
                                            << cols << " n " << n);
          std::vector<float> a(size_t(n * rows)), b(a.size()), a2(a.size()), b2(a.size());
          ops::matmul(w.v_q, x.data(), n, a.data());
          ops::matmul(w.v_r16, x.data(), n, b.data());
          same(a, b, n, "matmul");
          for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], all11[k]) << "batch invariance at " << k;
          const ops::MatmulJob ja[] = {{&w.v_q, a.data(), &bias}, {&u.v_q, a2.data(), nullptr}};
          const ops::MatmulJob jb[] = {{&w.v_r16, b.data(), &bias}, {&u.v_r16, b2.data(), nullptr}};
          ops::matmul_multi(x.data(), n, ja, 2);
          ops::matmul_multi(x.data(), n, jb, 2);
          same(a, b, n, "matmul_multi");
          for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], all11[k] + bias_f[k % size_t(rows)]);
          ops::matmul_rows(x.data(), n, jb, 2);
          for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(b[k], all11[k] + bias_f[k % size_t(rows)]);
          ops::matmul_swiglu(w.v_q, u.v_q, x.data(), n, a.data(), a2.data());
          ops::matmul_swiglu(w.v_r16, u.v_r16, x.data(), n, b.data(), b2.data());
          if (exact) EXPECT_EQ(a, b) << "swiglu";
        }
        // And the products are the weights', not zeros: token 0 against the
        // dequantised weights within the activation rounding (loose).
        for (int64_t o = 0; o < rows; o += 13) {
          double ref = 0, mag = 0;
          for (int64_t i = 0; i < cols; ++i) {
            ref += double(deq[size_t(o * cols + i)]) * x[size_t(i)];
            mag += std::fabs(double(deq[size_t(o * cols + i)]) * x[size_t(i)]);
          }
          EXPECT_NEAR(all11[size_t(o)], ref, 0.02 * mag) << "row " << o;
        }
      }
    }
}

TEST(Rows16, PaysOnlyWithTheKernel) {
  SimdGuard guard;
  ops::set_simd_level(ops::SimdLevel::Scalar);
  EXPECT_FALSE(ops::rows16_pays(DType::Q4_0));
  EXPECT_FALSE(ops::rows16_pays(DType::Q4_K));
  ops::set_simd_level(ops::best_simd_level());
  EXPECT_FALSE(ops::rows16_pays(DType::Q6_K));  // no 16-row layout at all
  if (ops::simd_level() == ops::SimdLevel::Avx512) {
    EXPECT_TRUE(ops::rows16_pays(DType::Q8_0));
    EXPECT_TRUE(ops::rows16_pays(DType::Q4_0));
    EXPECT_TRUE(ops::rows16_pays(DType::Q4_K));
  }
}

TEST(Rows16, BadTypesShapesAndRowPointersAreOneLineErrors) {
  std::vector<std::byte> buf(ops::quantized_bytes(DType::Q4_0, 20, 256));
  EXPECT_NE(error_of([&] { ops::pack_rows16(DType::Q4_0, buf.data(), 20, 64); }).find("20 rows is not a multiple of 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::pack_rows16(DType::Q4_0, buf.data(), 16, 40); }).find("not a multiple of Q4_0's block"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::pack_rows16(DType::Q5_0, buf.data(), 16, 64); }).find("Q5_0 has no 16-row layout"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::pack_rows16(DType::Q4_0_R16, buf.data(), 16, 64); }).find("no 16-row layout"),
            std::string::npos);  // already re-laid
  std::vector<float> out(256);
  for (DType r16 : {DType::Q8_0_R16, DType::Q4_0_R16, DType::Q4_K_R16})
    EXPECT_NE(error_of([&] { ops::dequantize_row(r16, buf.data(), out.data(), 256); }).find("groups of 16"),
              std::string::npos);
  const TensorView odd{buf.data(), DType::Q4_0_R16, {20, 64}};
  std::vector<float> x(64, 1.f), y(20);
  EXPECT_NE(error_of([&] { ops::matmul(odd, x.data(), 1, y.data()); }).find("not a multiple of its groups of 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::unpack_row16(DType::Q4_0_R16, buf.data(), 64, 16, buf.data()); }).find("row 16 of a 16-row group"),
            std::string::npos);
  const Relaid w(DType::Q4_0, 16, 64, 7);
  EXPECT_NE(error_of([&] { ops::row_to_f32(w.v_r16, 16, out.data()); }).find("row 16 of a weight with 16 rows"),
            std::string::npos);
}

}  // namespace
}  // namespace ptllm
