// Token selection from logits: greedy, temperature, top-k, top-p, with a
// seeded, platform-independent RNG so a seed reproduces a run anywhere.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace ptllm {

struct SamplerConfig {
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off; must be in (0, 1]
  uint64_t seed = 0;
};

// Throws Error naming the flag for out-of-range values.
void validate(const SamplerConfig& cfg);

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  int32_t sample(std::span<const float> logits);
  // Index of the largest logit (first on ties), as torch.argmax.
  static int32_t argmax(std::span<const float> logits);

 private:
  double uniform();  // [0, 1) from 53 random bits
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> weights_;  // exp((logit - max) / T) of cand_
  std::vector<double> all_w_;    // the same by token id (no top-k): ops::exp_weights
};

}  // namespace ptllm
