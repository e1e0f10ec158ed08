// Matrix-vector (decode) and matrix-matrix (prefill) products over GGUF
// block-quantised weights, next to BF16 at the same shape.
//
//   build/bench/quant_bench --benchmark_filter=QMatvec --benchmark_min_time=0.2
//
// Shapes: 2048 x 2048 (a 1B model's attention projection) and 8192 x 2048 (its
// ffn). "bytes_per_second" is weight bytes read per second; level 1 = AVX2,
// 2 = AVX-512 (VNNI), clamped to what the CPU has.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "bench_util.h"

namespace {

using namespace ptllm;

using bench::randn;
using bench::Weights;

void setup(benchmark::State& st, int level_arg, int threads_arg) {
  ops::set_simd_level(level_arg == 2 ? ops::SimdLevel::Avx512 : ops::SimdLevel::Avx2);
  ops::set_num_threads(threads_arg);
  st.SetLabel(std::string(ops::simd_level_name(ops::simd_level())));
}

// Args: out, in, level, threads (0 = all cores).
template <DType D>
void BM_QMatvec(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1);
  setup(st, int(st.range(2)), int(st.range(3)));
  Weights w(D, out, in, 0.02f);
  const auto x = randn(size_t(in), 1, 1.f);
  std::vector<float> y(static_cast<size_t>(out));
  for (auto _ : st) {
    ops::matmul(w.view, x.data(), 1, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(w.bytes.size()));
}
void MatvecArgs(benchmark::internal::Benchmark* b) {
  for (int level : {1, 2})
    for (auto [o, i] : {std::pair{2048, 2048}, {8192, 2048}}) b->Args({o, i, level, 0});
  b->ArgNames({"out", "in", "level", "threads"})->UseRealTime();
}
BENCHMARK(BM_QMatvec<DType::BF16>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q8_0>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q8_0_R16>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q4_0>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q4_0_R16>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q4_1>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q5_0>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q5_1>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q4_K>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q4_K_R16>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q5_K>)->Apply(MatvecArgs);
BENCHMARK(BM_QMatvec<DType::Q6_K>)->Apply(MatvecArgs);

// Prefill: Args out, in, tokens, level, threads. Reports GFLOP/s.
template <DType D>
void BM_QMatmul(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1), n = st.range(2);
  setup(st, int(st.range(3)), int(st.range(4)));
  Weights w(D, out, in, 0.02f);
  const auto x = randn(size_t(n * in), 1, 1.f);
  std::vector<float> y(size_t(n * out));
  for (auto _ : st) {
    ops::matmul(w.view, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(double(st.iterations()) * 2.0 * double(out * in * n) / 1e9,
                                              benchmark::Counter::kIsRate);
}
void MatmulArgs(benchmark::internal::Benchmark* b) {
  b->Args({2048, 2048, 64, 2, 0});
  b->ArgNames({"out", "in", "tokens", "level", "threads"})->UseRealTime();
}
BENCHMARK(BM_QMatmul<DType::BF16>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q8_0>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q8_0_R16>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q4_0>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q4_0_R16>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q4_K>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q4_K_R16>)->Apply(MatmulArgs);
BENCHMARK(BM_QMatmul<DType::Q6_K>)->Apply(MatmulArgs);

}  // namespace

BENCHMARK_MAIN();
