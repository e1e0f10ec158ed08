#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace ptllm {

StepLogprobs step_logprobs(std::span<const float> logits, int32_t chosen, int top) {
  const int64_t n = int64_t(logits.size());
  if (n == 0) fail("logprobs: empty logits");
  if (chosen < 0 || chosen >= n) fail("logprobs: token {} outside the vocabulary of {}", chosen, n);
  if (top < 0 || top > n) fail("logprobs: top {} expected in [0, {}]", top, n);
  // log-sum-exp in double: e^(l - max) summed by ops::exp_weights (the sampler's own sums).
  const double m = logits[size_t(ops::argmax(logits.data(), n))];
  if (!std::isfinite(m)) fail("logprobs: logits are not finite (max {})", m);
  std::vector<double> w(static_cast<size_t>(n));
  const double lse = m + std::log(ops::exp_weights(logits.data(), n, m, 1.0, w.data()));
  StepLogprobs out;
  out.chosen = {chosen, double(logits[size_t(chosen)]) - lse};
  if (top > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(i);
    std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    });
    for (int i = 0; i < top; ++i) out.top.push_back({ids[size_t(i)], double(logits[size_t(ids[size_t(i)])]) - lse});
  }
  return out;
}

}  // namespace ptllm
