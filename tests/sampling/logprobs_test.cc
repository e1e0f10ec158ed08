// step_logprobs against log-softmax written out in long double (the definition, not the code).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "sampling/logprobs.h"

namespace ptllm {
namespace {

long double reference_logprob(const std::vector<float>& l, size_t i) {
  long double sum = 0;
  for (float v : l) sum += std::exp((long double)v);
  return (long double)l[i] - std::log(sum);
}

TEST(Logprobs, ChosenAndTopMatchLogSoftmax) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i) * 0.37) * 6.0);
  l[417] = 9.5f;  // the most likely
  l[3] = 9.25f;   // second
  const StepLogprobs s = step_logprobs(l, 12, 3);
  EXPECT_EQ(s.chosen.id, 12);
  // fp32 logits, double sums: 1e-12 relative to the magnitude.
  EXPECT_NEAR(s.chosen.logprob, double(reference_logprob(l, 12)), 1e-12 * std::abs(s.chosen.logprob) + 1e-12);
  ASSERT_EQ(s.top.size(), 3u);
  EXPECT_EQ(s.top[0].id, 417);
  EXPECT_EQ(s.top[1].id, 3);
  for (const auto& t : s.top) EXPECT_NEAR(t.logprob, double(reference_logprob(l, size_t(t.id))), 1e-12);
  EXPECT_GE(s.top[1].logprob, s.top[2].logprob);
  // Probabilities of the whole vocabulary add up to 1.
  double total = 0;
  for (size_t i = 0; i < l.size(); ++i) total += std::exp(step_logprobs(l, int32_t(i), 0).chosen.logprob);
  EXPECT_NEAR(total, 1.0, 1e-9);
}

TEST(Logprobs, TiesByLowerIdAndNoTopWhenZero) {
  const std::vector<float> l = {1.f, 2.f, 2.f, 0.f};
  const StepLogprobs s = step_logprobs(l, 0, 2);
  EXPECT_EQ(s.top[0].id, 1);
  EXPECT_EQ(s.top[1].id, 2);
  EXPECT_TRUE(step_logprobs(l, 0, 0).top.empty());
}

TEST(Logprobs, BadInputIsAnError) {
  const std::vector<float> l = {1.f, 2.f};
  EXPECT_THROW(step_logprobs(l, 2, 0), Error);
  EXPECT_THROW(step_logprobs(l, -1, 0), Error);
  EXPECT_THROW(step_logprobs(l, 0, 3), Error);
  EXPECT_THROW(step_logprobs({}, 0, 0), Error);
  const std::vector<float> bad = {1.f, NAN, INFINITY};
  EXPECT_THROW(step_logprobs(bad, 0, 0), Error);
}

}  // namespace
}  // namespace ptllm
