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

// Without top-k / top-p every token can be drawn, so nothing is sorted: one
// pass for the max, one for the weights, a scan in id order (a serving step
// used to sort the whole vocabulary, ~25% of a 27M model's step). top-k
// sorts k candidates; top-p sorts a growing top slice (64, 256, ... tokens)
// until its mass reaches top_p of the total, so a peaked distribution costs
// a partial sort of a few dozen tokens and a flat one at worst a full sort.
int32_t Sampler::sample(std::span<const float> logits) {
  if (cfg_.temperature == 0) return argmax(logits);
  const double inv_t = 1.0 / cfg_.temperature;
  cand_.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i])) cand_.emplace_back(logits[i], int32_t(i));
  if (cand_.empty()) fail("all logits are NaN");
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const bool top_k = cfg_.top_k > 0 && size_t(cfg_.top_k) < cand_.size();
  if (top_k) {
    std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(cfg_.top_k), cand_.end(), by_logit);
    cand_.resize(size_t(cfg_.top_k));
  }
  float mx = -INFINITY;
  for (const auto& c : cand_) mx = std::max(mx, c.first);
  const double m = mx;
  weights_.resize(cand_.size());
  double total = 0;
  for (size_t i = 0; i < cand_.size(); ++i) total += weights_[i] = std::exp((double(cand_[i].first) - m) * inv_t);
  // Draws with weights w[0..n) of candidates c[0..n), their sum `sum`.
  const auto draw = [&](size_t n, double sum) {
    double r = uniform() * sum;
    for (size_t i = 0; i < n; ++i) {
      r -= weights_[i];
      if (r < 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
  };
  if (cfg_.top_p >= 1.0) return draw(cand_.size(), total);
  // Smallest prefix in logit order whose mass reaches top_p (at least one token).
  const double target = cfg_.top_p * total;
  size_t sorted = top_k ? cand_.size() : 0;  // top-k left its k candidates sorted
  for (size_t slice = 64;; slice *= 4) {
    const size_t k = std::min(slice, cand_.size());
    if (sorted < k) {
      std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(k), cand_.end(), by_logit);
      sorted = k;
    }
    double cum = 0;
    for (size_t n = 0; n < k; ++n) {
      cum += weights_[n] = std::exp((double(cand_[n].first) - m) * inv_t);
      if (cum >= target) return draw(n + 1, cum);
    }
    if (k == cand_.size()) return draw(k, cum);  // rounding: the whole set
  }
}

}  // namespace ptllm
