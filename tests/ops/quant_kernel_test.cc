// Quantised matrix products at every ISA level: against the scalar integer
// path (tight), against dequantise-then-fp32 (bounded by the activation's
// rounding), bit-identical rows whatever n_tokens is, the ops:: hooks, and
// bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "ops/quant_impl.h"
#include "test_util.h"

namespace ptllm {
namespace {

using test::randn;
using test::SimdGuard;

constexpr DType kTypes[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                            DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// A random [rows, cols] weight quantised to t, plus its exact dequantisation.
struct QWeight {
  std::vector<std::byte> bytes;
  std::vector<float> deq;
  TensorView view;
  QWeight(DType t, int64_t rows, int64_t cols, uint64_t seed) {
    const auto w = randn(size_t(rows * cols), seed, 0.05f);
    bytes.resize(ops::quantized_bytes(t, rows, cols));
    ops::quantize_tensor(t, w.data(), DType::F32, rows, cols, bytes.data());
    deq.resize(w.size());
    ops::to_f32(bytes.data(), t, deq.data(), rows * cols);  // whole tensor: rows are whole blocks
    view = TensorView{bytes.data(), t, {rows, cols}};
  }
};

std::vector<float> run(const TensorView& w, const std::vector<float>& x, int64_t n_tokens) {
  std::vector<float> y(size_t(n_tokens * w.rows()));
  ops::matmul(w, x.data(), n_tokens, y.data());
  return y;
}

// Bound on |y - W·x| from quantising x: each x_i moves by at most half its
// block's step amax/127 (blocks of 32, or 256 for the K types), so the error
// is <= sum_i |w_i| * step_i / 2; plus fp32 accumulation, 2e-6 * sum |w_i x_i|.
double act_bound(DType t, const float* w, const float* x, int64_t n) {
  const int64_t bs = (t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K) ? 256 : 32;
  double bound = 0, mag = 0;
  for (int64_t b = 0; b < n; b += bs) {
    float amax = 0;
    for (int64_t i = b; i < b + bs; ++i) amax = std::max(amax, std::fabs(x[i]));
    double sw = 0;
    for (int64_t i = b; i < b + bs; ++i) {
      sw += std::fabs(w[i]);
      mag += std::fabs(double(w[i]) * x[i]);
    }
    bound += sw * amax / 127.0 / 2;
  }
  return bound + 2e-6 * mag;
}

struct Shape {
  int64_t rows, cols, n_tokens;
};
// Odd row counts (partial row blocks and token groups), cols 256 .. 8192.
constexpr Shape kShapes[] = {{37, 256, 1}, {37, 256, 3}, {19, 768, 16}, {64, 2048, 3}, {9, 8192, 1}, {5, 8192, 16}};

TEST(QuantMatmul, EveryLevelMatchesScalarIntegerPathAndFp32) {
  SimdGuard g;
  // set_simd_level clamps to the CPU: say which kernels a level really ran.
  std::printf("best SIMD level here: %s (AVX-512 VNNI kernels need avx512vnni/vl/bw; without them that level runs AVX2); CPU: %s\n",
              std::string(ops::simd_level_name(ops::best_simd_level())).c_str(), ops::cpu_features().c_str());
  for (DType t : kTypes)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " " << s.rows << "x" << s.cols << " n=" << s.n_tokens);
      QWeight w(t, s.rows, s.cols, 11 + uint64_t(t));
      const auto x = randn(size_t(s.n_tokens * s.cols), 5);
      ops::set_simd_level(ops::SimdLevel::Scalar);
      const auto ref = run(w.view, x, s.n_tokens);
      std::vector<double> mag(ref.size());  // sum |w x| per output
      for (int64_t tk = 0; tk < s.n_tokens; ++tk)
        for (int64_t o = 0; o < s.rows; ++o) {
          const float* wr = w.deq.data() + o * s.cols;
          const float* xr = x.data() + tk * s.cols;
          double exact = 0, m = 0;
          for (int64_t i = 0; i < s.cols; ++i) {
            exact += double(wr[i]) * xr[i];
            m += std::fabs(double(wr[i]) * xr[i]);
          }
          const size_t k = size_t(tk * s.rows + o);
          mag[k] = m;
          ASSERT_NEAR(ref[k], exact, act_bound(t, wr, xr, s.cols)) << "scalar vs fp32, token " << tk << " row " << o;
        }
      // The SIMD levels do the same integer sums; only the fp32 order of the
      // per-block terms differs: within 1e-5 of sum |w x|.
      for (ops::SimdLevel lv : ops::available_simd_levels()) {
        ops::set_simd_level(lv);
        const auto y = run(w.view, x, s.n_tokens);
        for (size_t k = 0; k < y.size(); ++k)
          ASSERT_NEAR(y[k], ref[k], 1e-5 * mag[k]) << ops::simd_level_name(lv) << " vs scalar, output " << k;
      }
    }
}

// The SIMD activation quantisers must write the scalar one's bytes exactly
// (every level then multiplies the same integers): random blocks, an all-zero
// block, exact .5 ties, and a block with an infinity (scale NaN, levels 0).
TEST(QuantMatmul, ActivationQuantiserIsIdenticalAtEveryLevel) {
  auto x = randn(1024, 21, 3.f);
  for (int i = 256; i < 512; ++i) x[size_t(i)] = 0.f;
  for (int i = 512; i < 544; ++i) x[size_t(i)] = float(i - 528) + 0.5f;  // amax 15.5: ties at x * 127/15.5?
  x[600] = INFINITY;
  x[900] = -NAN;
  for (DType t : {DType::Q8_0, DType::Q4_K}) {
    const size_t bytes = ops::q::act_row_bytes(t, 1024);
    std::vector<std::byte> ref(bytes), got(bytes);
    ops::q::kernels_scalar().quantize_act(t, x.data(), 1024, ref.data());
    // This architecture's SIMD tables (the x86 ones need AVX2 to run at all).
#if defined(__x86_64__)
    const ops::q::Kernels* tables[] = {&ops::q::kernels_avx2(), &ops::q::kernels_avx512()};
#elif defined(__aarch64__)
    const ops::q::Kernels* tables[] = {&ops::q::kernels_neon(), &ops::q::kernels_neon_dotprod()};
#else
    const ops::q::Kernels* tables[] = {&ops::q::kernels_scalar()};
#endif
    for (const ops::q::Kernels* k : tables) {
      if (ops::best_simd_level() == ops::SimdLevel::Scalar) break;  // no SIMD: nothing else to run
      std::fill(got.begin(), got.end(), std::byte{0x5a});
      k->quantize_act(t, x.data(), 1024, got.data());
      // Compare field by field: NaN scales compare unequal as floats, so bytes.
      EXPECT_EQ(std::memcmp(ref.data(), got.data(), bytes), 0) << dtype_name(t);
    }
  }
}

TEST(QuantMatmul, RowsAreBitIdenticalWhateverNTokens) {
  SimdGuard g;
  const int64_t rows = 21, cols = 512, n = 16;
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    ops::set_simd_level(lv);
    for (DType t : kTypes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " " << ops::simd_level_name(lv));
      QWeight w(t, rows, cols, 3);
      const auto x = randn(size_t(n * cols), 9);
      const auto all = run(w.view, x, n);
      for (int64_t tk = 0; tk < n; ++tk) {
        const std::vector<float> xr(x.begin() + tk * cols, x.begin() + (tk + 1) * cols);
        const auto one = run(w.view, xr, 1);
        for (int64_t o = 0; o < rows; ++o) ASSERT_EQ(one[size_t(o)], all[size_t(tk * rows + o)]) << tk << " " << o;
      }
      // Three tokens (a partial group) give the same rows too.
      const std::vector<float> x3(x.begin() + 5 * cols, x.begin() + 8 * cols);
      const auto three = run(w.view, x3, 3);
      for (int64_t k = 0; k < 3 * rows; ++k) ASSERT_EQ(three[size_t(k)], all[size_t(5 * rows + k)]);
    }
  }
}

// An odd number of blocks per row (the 512-bit tiles of the 32-element types
// pair blocks: the last one goes alone), rows that do not fill a row tile, and
// a weight view that starts one row later (so every row meets different tile
// neighbours): each output equals the scalar path's within 1e-5 of sum |w x|,
// and is bit-identical to the same row and token computed with other rows and
// tokens. The K types (super-blocks of 256, tiled one super-block at a time)
// take 3 super-blocks.
TEST(QuantMatmul, OddBlockCountsAndRowTilesAgree) {
  SimdGuard g;
  const int64_t rows = 7, n = 6;
  for (DType t : kTypes) {
    const int64_t cols = ops::q::uses_a256(t) ? 3 * 256 : 9 * 32;
    QWeight w(t, rows, cols, 17);
    const auto x = randn(size_t(n * cols), 23);
    ops::set_simd_level(ops::SimdLevel::Scalar);
    const auto ref = run(w.view, x, n);
    for (ops::SimdLevel lv : ops::available_simd_levels()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " " << ops::simd_level_name(lv));
      ops::set_simd_level(lv);
      const auto all = run(w.view, x, n);
      for (int64_t tk = 0; tk < n; ++tk)
        for (int64_t o = 0; o < rows; ++o) {
          double mag = 0;
          for (int64_t i = 0; i < cols; ++i) mag += std::fabs(double(w.deq[size_t(o * cols + i)]) * x[size_t(tk * cols + i)]);
          const size_t k = size_t(tk * rows + o);
          ASSERT_NEAR(all[k], ref[k], 1e-5 * mag) << "token " << tk << " row " << o;
        }
      const TensorView later{w.bytes.data() + storage_bytes(t, size_t(cols)), t, {rows - 1, cols}};
      for (int64_t tk = 0; tk < n; ++tk) {
        const std::vector<float> xr(x.begin() + tk * cols, x.begin() + (tk + 1) * cols);
        const auto one = run(w.view, xr, 1), shifted = run(later, xr, 1);
        for (int64_t o = 0; o < rows; ++o) ASSERT_EQ(one[size_t(o)], all[size_t(tk * rows + o)]) << tk << " " << o;
        for (int64_t o = 1; o < rows; ++o) ASSERT_EQ(shifted[size_t(o - 1)], one[size_t(o)]) << tk << " " << o;
      }
    }
  }
}

TEST(QuantMatmul, MultiSwigluBiasAndMixedJobsEqualSeparateCalls) {
  SimdGuard g;
  const int64_t in = 256, F = 40, n = 3;
  QWeight wg(DType::Q4_K, F, in, 1), wu(DType::Q6_K, F, in, 2), wq(DType::Q8_0, 24, in, 3);
  const auto x = randn(size_t(n * in), 4);
  std::vector<float> bias_f = randn(24, 5);
  TensorView bias{reinterpret_cast<const std::byte*>(bias_f.data()), DType::F32, {24}};
  std::vector<float> plain_w = randn(size_t(8 * in), 6);
  TensorView plain{reinterpret_cast<const std::byte*>(plain_w.data()), DType::F32, {8, in}};
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    ops::set_simd_level(lv);
    auto g_ref = run(wg.view, x, n), u_ref = run(wu.view, x, n);
    ops::silu_mul(g_ref.data(), u_ref.data(), n * F);
    std::vector<float> gate(size_t(n * F)), up(size_t(n * F));
    ops::matmul_swiglu(wg.view, wu.view, x.data(), n, gate.data(), up.data());
    EXPECT_EQ(gate, g_ref);

    std::vector<float> yq(size_t(n * 24)), yp(size_t(n * 8)), yq_ref(yq.size()), yp_ref(yp.size());
    ops::matmul(wq.view, x.data(), n, yq_ref.data(), &bias);
    ops::matmul(plain, x.data(), n, yp_ref.data());
    const ops::MatmulJob jobs[] = {{&wq.view, yq.data(), &bias}, {&plain, yp.data(), nullptr}};
    ops::matmul_multi(x.data(), n, jobs, 2);
    EXPECT_EQ(yq, yq_ref);
    EXPECT_EQ(yp, yp_ref);
    const auto nobias = run(wq.view, x, n);
    for (size_t k = 0; k < yq.size(); ++k) EXPECT_EQ(yq[k], nobias[k] + bias_f[k % 24]);
  }
}

TEST(QuantHooks, ToF32AndDotRowUseTheExactDequantisation) {
  for (DType t : kTypes) {
    QWeight w(t, 3, 1024, 8);
    const auto x = randn(1024, 9);
    std::vector<float> row(1024);
    const size_t rb = storage_bytes(t, 1024);
    ops::to_f32(w.bytes.data() + rb, t, row.data(), 1024);  // an embedding row lookup
    for (int i = 0; i < 1024; ++i) ASSERT_EQ(row[size_t(i)], w.deq[size_t(1024 + i)]);
    double exact = 0, mag = 0;
    for (int i = 0; i < 1024; ++i) {
      exact += double(row[size_t(i)]) * x[size_t(i)];
      mag += std::fabs(double(row[size_t(i)]) * x[size_t(i)]);
    }
    EXPECT_NEAR(ops::dot_row(w.bytes.data() + rb, t, x.data(), 1024), exact, 1e-5 * mag) << dtype_name(t);
  }
}

TEST(QuantHooks, QuantizeTensorFromBf16EqualsRowByRow) {
  const int64_t rows = 7, cols = 512;
  const auto w = randn(size_t(rows * cols), 12);
  std::vector<uint16_t> wb(w.size());
  std::vector<float> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = bf16_to_f32(wb[i] = f32_to_bf16(w[i]));
  for (DType t : kTypes) {
    std::vector<uint8_t> a(ops::quantized_bytes(t, rows, cols)), b(a.size());
    ops::quantize_tensor(t, wb.data(), DType::BF16, rows, cols, a.data());
    for (int64_t r = 0; r < rows; ++r)
      ops::quantize_row(t, wr.data() + r * cols, b.data() + size_t(r) * storage_bytes(t, size_t(cols)), cols);
    EXPECT_EQ(a, b) << dtype_name(t);
  }
}

TEST(QuantErrors, BadInputThrowsOneLineErrors) {
  std::vector<float> x(300, 1.f);
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(ops::quantize_row(DType::Q4_K, x.data(), buf.data(), 300), Error);  // not a multiple of 256
  EXPECT_THROW(ops::quantize_row(DType::F16, x.data(), buf.data(), 256), Error);   // not a block type
  EXPECT_THROW(ops::dequantize_row(DType::Q8_0, buf.data(), x.data(), 33), Error);
  x[5] = NAN;
  EXPECT_THROW(ops::quantize_row(DType::Q8_0, x.data(), buf.data(), 32), Error);
  EXPECT_THROW(ops::quantize_tensor(DType::Q8_0, x.data(), DType::F32, 1, 32, buf.data()), Error);
  EXPECT_THROW(ops::quantize_tensor(DType::Q8_0, x.data(), DType::I8, 1, 32, buf.data()), Error);
  TensorView w{reinterpret_cast<const std::byte*>(buf.data()), DType::Q8_0, {2, 48}};  // 48 % 32 != 0
  std::vector<float> y(4);
  EXPECT_THROW(ops::matmul(w, x.data(), 1, y.data()), Error);
  TensorView w1{reinterpret_cast<const std::byte*>(buf.data()), DType::Q8_0, {64}};
  EXPECT_THROW(ops::matmul(w1, x.data(), 1, y.data()), Error);
  try {
    ops::quantize_row(DType::Q4_K, x.data(), buf.data(), 300);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("Q4_K"), std::string::npos) << e.what();
  }
}

TEST(QuantErrors, NonFiniteActivationGivesNaNNotGarbage) {
  SimdGuard g;
  QWeight w(DType::Q4_0, 4, 64, 1);
  std::vector<float> x(64, 0.5f);
  x[40] = INFINITY;
  for (ops::SimdLevel lv : ops::available_simd_levels()) {
    ops::set_simd_level(lv);
    const auto y = run(w.view, x, 1);
    for (float v : y) EXPECT_TRUE(std::isnan(v));
  }
}

}  // namespace
}  // namespace ptllm
