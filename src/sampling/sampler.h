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
  // min-p (llama.cpp's, vLLM's): after temperature, top-k and top-p, drop the tokens whose
  // probability is below min_p times the most likely one's; 0 = off, in [0, 1].
  double min_p = 0.0;
  // OpenAI's penalties and bias, applied to the logits before anything else (greedy
  // included): logit[t] + bias[t] - frequency_penalty * c[t] - presence_penalty * (c[t] > 0),
  // c[t] = how many times this sampler has drawn t (the generated tokens, not the
  // prompt, as OpenAI and vLLM count them). All off by default.
  double presence_penalty = 0.0;   // [-2, 2]
  double frequency_penalty = 0.0;  // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias{};  // (token id >= 0, [-100, 100]); a repeated id adds up
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
  int32_t draw(std::span<const float> logits);
  // The logits with bias and penalties applied (adjusted_ holds them), or `logits` itself
  // when none applies.
  std::span<const float> adjust(std::span<const float> logits);
  SamplerConfig cfg_;
  bool adjusts_ = false;             // any bias or penalty
  std::vector<int32_t> counts_;      // [vocab]: times drawn (penalties only)
  std::vector<int32_t> drawn_;       // ids with counts_ > 0, first draw order
  std::vector<float> adjusted_;      // [vocab]
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<double> weights_;  // exp((logit - max) / T) of cand_
  std::vector<double> all_w_;    // the same by token id (no top-k): ops::exp_weights
};

}  // namespace ptllm
