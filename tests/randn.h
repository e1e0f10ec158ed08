// Seeded normal random inputs, shared by the tests (test_util.h) and the
// micro-benchmarks (bench/bench_util.h). Header-only, no project dependencies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace ptllm::test {

// n normal values with standard deviation `sd`, the same for the same seed.
inline std::vector<float> randn(size_t n, uint64_t seed, float sd = 1.f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace ptllm::test
