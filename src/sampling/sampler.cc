#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/finite.h"
#include "ops/ops.h"

namespace ptllm {

void validate(const SamplerConfig& c) {
  if (!(c.temperature >= 0) || !std::isfinite(c.temperature))
    fail("--temperature {}: expected a finite number >= 0", c.temperature);
  if (c.top_k < 0) fail("--top-k {}: expected >= 0 (0 = off)", c.top_k);
  if (!(c.top_p > 0 && c.top_p <= 1)) fail("--top-p {}: expected a value in (0, 1]", c.top_p);
  if (!(c.min_p >= 0 && c.min_p <= 1)) fail("--min-p {}: expected a value in [0, 1]", c.min_p);
  if (!(c.presence_penalty >= -2 && c.presence_penalty <= 2))
    fail("--presence-penalty {}: expected a value in [-2, 2]", c.presence_penalty);
  if (!(c.frequency_penalty >= -2 && c.frequency_penalty <= 2))
    fail("--frequency-penalty {}: expected a value in [-2, 2]", c.frequency_penalty);
  for (const auto& [id, b] : c.logit_bias) {
    if (id < 0) fail("--logit-bias {}: expected a token id >= 0", id);
    if (!(b >= -100 && b <= 100)) fail("--logit-bias {}: bias {} expected in [-100, 100]", id, b);
  }
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {
  validate(cfg);
  adjusts_ = cfg.presence_penalty != 0 || cfg.frequency_penalty != 0 || !cfg.logit_bias.empty();
}

std::span<const float> Sampler::adjust(std::span<const float> logits) {
  if (!adjusts_) return logits;
  const size_t n = logits.size();
  adjusted_.assign(logits.begin(), logits.end());
  for (const auto& [id, b] : cfg_.logit_bias)
    if (size_t(id) < n) adjusted_[size_t(id)] += b;  // ids past this vocabulary: nothing to bias
  // Only drawn ids carry a penalty: a pass over them, not the vocabulary.
  for (const int32_t id : drawn_)
    if (size_t(id) < n) {
      const int32_t c = counts_[size_t(id)];
      adjusted_[size_t(id)] -= float(cfg_.frequency_penalty * c + cfg_.presence_penalty);
    }
  return adjusted_;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t id = draw(adjust(logits));
  if (adjusts_ && (cfg_.presence_penalty != 0 || cfg_.frequency_penalty != 0) && id >= 0) {
    if (counts_.size() <= size_t(id)) counts_.resize(std::max(logits.size(), size_t(id) + 1), 0);
    if (counts_[size_t(id)]++ == 0) drawn_.push_back(id);
  }
  return id;
}

double Sampler::uniform() { return double(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::argmax(std::span<const float> logits) {
  return int32_t(ops::argmax(logits.data(), int64_t(logits.size())));
}

// Without top-k / top-p every token can be drawn, so nothing is sorted: the max,
// the weights and their sum (ops::argmax, ops::exp_weights: vector code with the
// same bits everywhere), and a scan in id order (a serving step used to sort the
// whole vocabulary, ~25% of a 27M model's step). top-k sorts k candidates; top-p
// takes the same weights and sorts a growing top slice (64, 256, ... tokens) until
// its mass reaches top_p of the total, so a peaked distribution costs a partial
// sort of a few dozen tokens and a flat one at worst a full sort.
namespace {
// min-p over weights e^((l - max) / T), the most likely token's 1: zeroes those below min_p
// (the most likely is always kept) and returns the sum of the rest.
double keep_min_p(double* w, size_t n, double min_p) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] < min_p) w[i] = 0;
    sum += w[i];
  }
  return sum;
}
}  // namespace

int32_t Sampler::draw(std::span<const float> logits) {
  if (cfg_.temperature == 0) return argmax(logits);
  const double inv_t = 1.0 / cfg_.temperature;
  const int64_t n = int64_t(logits.size());
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  // Draws among candidates cand_[0..count) with weights weights_[0..count), their sum `sum`
  // (min-p applied first).
  const auto draw = [&](size_t count, double sum) {
    if (cfg_.min_p > 0) sum = keep_min_p(weights_.data(), count, cfg_.min_p);
    double r = uniform() * sum;
    for (size_t i = 0; i < count; ++i) {
      r -= weights_[i];
      if (r < 0) return cand_[i].second;
    }
    for (size_t i = count; i-- > 0;)  // rounding: the last candidate with a weight
      if (weights_[i] > 0) return cand_[i].second;
    return cand_[0].second;
  };
  // top-p: the smallest prefix of cand_ in logit order whose mass reaches top_p of
  // `total` (at least one token), its first `sorted` already in order; weight(c) is a
  // candidate's weight.
  const auto top_p_draw = [&](double total, size_t sorted, const auto& weight) {
    const double target = cfg_.top_p * total;
    weights_.resize(cand_.size());
    for (size_t slice = 64;; slice *= 4) {
      const size_t k = std::min(slice, cand_.size());
      if (sorted < k) {
        std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(k), cand_.end(), by_logit);
        sorted = k;
      }
      double cum = 0;
      for (size_t i = 0; i < k; ++i) {
        cum += weights_[i] = weight(cand_[i]);
        if (cum >= target) return draw(i + 1, cum);
      }
      if (k == cand_.size()) return draw(k, cum);  // rounding: the whole set
    }
  };
  if (cfg_.top_k == 0 && n > 0 && all_finite(logits.data(), n)) {
    // Every token a candidate: the weights and their sum in vector code
    // (ops::exp_weights, the same bits on every machine).
    const double m = logits[size_t(ops::argmax(logits.data(), n))];
    all_w_.resize(size_t(n));
    const double total = ops::exp_weights(logits.data(), n, m, inv_t, all_w_.data());
    if (cfg_.top_p >= 1.0) {  // the draw's scan in id order (min-p: over the tokens it keeps)
      const double sum = cfg_.min_p > 0 ? keep_min_p(all_w_.data(), size_t(n), cfg_.min_p) : total;
      double r = uniform() * sum;
      for (int64_t i = 0; i < n; ++i) {
        r -= all_w_[size_t(i)];
        if (r < 0) return int32_t(i);
      }
      for (int64_t i = n; i-- > 0;)  // rounding: the last token with a weight
        if (all_w_[size_t(i)] > 0) return int32_t(i);
      return int32_t(n - 1);
    }
    cand_.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) cand_[size_t(i)] = {logits[size_t(i)], int32_t(i)};
    return top_p_draw(total, 0, [&](const std::pair<float, int32_t>& c) { return all_w_[size_t(c.second)]; });
  }
  // top-k, or logits that are not all finite (NaNs are never drawn).
  cand_.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i])) cand_.emplace_back(logits[i], int32_t(i));
  if (cand_.empty()) fail("all logits are NaN");
  const bool top_k = cfg_.top_k > 0 && size_t(cfg_.top_k) < cand_.size();
  if (top_k) {
    std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(cfg_.top_k), cand_.end(), by_logit);
    cand_.resize(size_t(cfg_.top_k));
  }
  float mx = -INFINITY;
  for (const auto& c : cand_) mx = std::max(mx, c.first);
  const double m = mx;
  const auto weight = [&](const std::pair<float, int32_t>& c) { return std::exp((double(c.first) - m) * inv_t); };
  weights_.resize(cand_.size());
  double total = 0;
  for (size_t i = 0; i < cand_.size(); ++i) total += weights_[i] = weight(cand_[i]);
  if (cfg_.top_p >= 1.0) return draw(cand_.size(), total);
  return top_p_draw(total, top_k ? cand_.size() : 0, weight);
}

}  // namespace ptllm
