#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ptllm {

void validate(const SamplerConfig& c) {
  if (!(c.temperature >= 0) || !std::isfinite(c.temperature))
    fail("--temperature {}: expected a finite number >= 0", c.temperature);
  if (c.top_k < 0) fail("--top-k {}: expected >= 0 (0 = off)", c.top_k);
  if (!(c.top_p > 0 && c.top_p <= 1)) fail("--top-p {}: expected a value in (0, 1]", c.top_p);
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { validate(cfg); }

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)]) best = int32_t(i);
  return best;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (cfg_.temperature == 0) return argmax(logits);
  cand_.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i])) cand_.emplace_back(logits[i], int32_t(i));
  if (cand_.empty()) fail("all logits are NaN");
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = cand_.size();
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < keep) {
    keep = size_t(cfg_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(keep), cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax at temperature over the kept candidates (sorted, largest first).
  const double inv_t = 1.0 / cfg_.temperature;
  const double m = cand_[0].first;
  std::vector<double> p(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); ++i) sum += p[i] = std::exp((cand_[i].first - m) * inv_t);
  for (auto& x : p) x /= sum;
  if (cfg_.top_p < 1.0) {
    // Smallest prefix whose mass reaches top_p (always at least one token).
    double cum = 0;
    size_t n = 0;
    while (n < p.size()) {
      cum += p[n++];
      if (cum >= cfg_.top_p) break;
    }
    p.resize(n);
    sum = cum;
  } else {
    sum = 1.0;
  }
  double r = uniform() * sum;
  for (size_t i = 0; i < p.size(); ++i) {
    r -= p[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[p.size() - 1].second;
}

}  // namespace ptllm
