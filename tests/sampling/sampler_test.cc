#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "sampling/sampler.h"

namespace ptllm {
namespace {

TEST(Sampler, GreedyPicksArgmaxFirstOnTies) {
  Sampler s({0.0, 0, 1.0, 1});
  std::vector<float> l = {0.1f, 3.f, 3.f, -1.f};
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  Sampler s({1.5, 1, 1.0, 7});
  std::vector<float> l = {0.1f, 0.2f, 5.f, 0.3f};
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample(l), 2);
}

TEST(Sampler, TopPKeepsSmallestPrefix) {
  // probs at T=1: ~[0.665, 0.245, 0.09]; top_p 0.6 keeps only the first.
  Sampler s({1.0, 0, 0.6, 3});
  std::vector<float> l = {2.f, 1.f, 0.f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l), 0);
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  Sampler s({1.0, 0, 1.0, 11});
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int, int> n;
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++n[s.sample(l)];
  EXPECT_NEAR(n[0] / double(N), 0.5, 0.02);
  EXPECT_NEAR(n[1] / double(N), 0.3, 0.02);
  EXPECT_NEAR(n[2] / double(N), 0.2, 0.02);
}

// top-p over a flat distribution needs more than the first sorted slice (64):
// 1,000 equal logits at top_p 0.5 keep exactly the 500 lowest ids (ties go
// to the lower id), each drawn about equally often.
TEST(Sampler, TopPOverAFlatDistributionKeepsHalf) {
  Sampler s({1.0, 0, 0.5, 5});
  std::vector<float> l(1000, 0.25f);
  std::map<int, int> n;
  const int N = 20000;
  for (int i = 0; i < N; ++i) {
    const int id = s.sample(l);
    ASSERT_LT(id, 500);
    ++n[id];
  }
  EXPECT_GT(n.size(), 480u);  // nearly every one of the 500 is drawn
  int lo = 0;
  for (const auto& [id, c] : n) lo += id < 250 ? c : 0;
  EXPECT_NEAR(lo / double(N), 0.5, 0.03);
}

// Without top-k / top-p (nothing sorted) and with top-k, frequencies follow the
// softmax at the temperature, including over a larger vocabulary.
TEST(Sampler, FrequenciesFollowSoftmaxAtTemperatureWithTopK) {
  std::vector<float> l(300, -30.f);
  l[7] = 1.f, l[100] = 0.f, l[299] = 0.5f;
  const double T = 0.8;
  const double w[3] = {std::exp(1 / T), std::exp(0 / T), std::exp(0.5 / T)};
  const double z = w[0] + w[1] + w[2];
  for (int64_t k : {0, 3}) {
    Sampler s({T, k, 1.0, 17});
    std::map<int, int> n;
    const int N = 20000;
    for (int i = 0; i < N; ++i) ++n[s.sample(l)];
    EXPECT_NEAR(n[7] / double(N), w[0] / z, 0.02) << k;
    EXPECT_NEAR(n[100] / double(N), w[1] / z, 0.02) << k;
    EXPECT_NEAR(n[299] / double(N), w[2] / z, 0.02) << k;
  }
}

// top-p over a vocabulary with a tail: the kept prefix and the frequencies inside it
// follow the softmax renormalised over that prefix (the weights from ops::exp_weights).
TEST(Sampler, TopPFrequenciesFollowTheKeptPrefix) {
  std::vector<float> l(3000, -4.f);
  l[2500] = 2.f, l[10] = 1.5f, l[700] = 1.f;
  const double T = 0.7, e = std::exp(-4 / T);
  const double w[3] = {std::exp(2 / T), std::exp(1.5 / T), std::exp(1 / T)};
  const double z = w[0] + w[1] + w[2] + 2997 * e;
  // top_p between the mass of the first two and of the first three: three are kept.
  const double p = (w[0] + w[1] + 0.5 * w[2]) / z;
  Sampler s({T, 0, p, 23});
  std::map<int, int> n;
  const int N = 20000;
  for (int i = 0; i < N; ++i) ++n[s.sample(l)];
  EXPECT_EQ(n.size(), 3u);
  const double kept = w[0] + w[1] + w[2];
  EXPECT_NEAR(n[2500] / double(N), w[0] / kept, 0.02);
  EXPECT_NEAR(n[10] / double(N), w[1] / kept, 0.02);
  EXPECT_NEAR(n[700] / double(N), w[2] / kept, 0.02);
}

// A NaN logit is never drawn, with or without top-k / top-p (such logits take the
// general path; the decoders reject non-finite logits before sampling anyway).
TEST(Sampler, NanLogitsAreNeverDrawn) {
  std::vector<float> l = {NAN, 0.5f, NAN, 0.4f, 0.1f, NAN};
  for (const SamplerConfig& c : {SamplerConfig{1.0, 0, 1.0, 3}, SamplerConfig{1.0, 0, 0.9, 3},
                                 SamplerConfig{1.0, 2, 1.0, 3}, SamplerConfig{0.0, 0, 1.0, 3}}) {
    Sampler s(c);
    for (int i = 0; i < 200; ++i) {
      const int id = s.sample(l);
      ASSERT_TRUE(id == 1 || id == 3 || id == 4) << id;
    }
  }
  std::vector<float> all_nan(4, NAN);
  EXPECT_THROW(Sampler({1.0, 0, 1.0, 3}).sample(all_nan), Error);
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[size_t(i)] = float(i % 7) * 0.3f;
  Sampler a({0.9, 20, 0.9, 42}), b({0.9, 20, 0.9, 42}), c({0.9, 20, 0.9, 43});
  int diff = 0;
  for (int i = 0; i < 200; ++i) {
    const int x = a.sample(l);
    EXPECT_EQ(x, b.sample(l));
    diff += x != c.sample(l);
  }
  EXPECT_GT(diff, 0);
}

TEST(Sampler, RejectsBadSettings) {
  EXPECT_THROW(validate({-1.0, 0, 1.0, 0}), Error);
  EXPECT_THROW(validate({1.0, 0, 0.0, 0}), Error);
  EXPECT_THROW(validate({1.0, 0, 1.5, 0}), Error);
  EXPECT_THROW(validate({1.0, -3, 1.0, 0}), Error);
  EXPECT_NO_THROW(validate({0.0, 0, 1.0, 0}));
  SamplerConfig c;
  c.presence_penalty = 2.01;
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.frequency_penalty = -2.5;
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.logit_bias = {{-1, 1.f}};
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.logit_bias = {{3, 100.5f}};
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.logit_bias = {{3, NAN}};
  EXPECT_THROW(validate(c), Error);
}

// min-p: a token is kept when its probability is at least min_p times the most likely's.
// Logits {0, ln 0.5, ln 0.25, ln 0.1} at T = 1: relative probabilities 1, 0.5, 0.25, 0.1, so
// min_p 0.3 keeps the first two, drawn 2 : 1; the same through the top-k and top-p paths.
TEST(Sampler, MinPKeepsTokensNearTheMostLikely) {
  const std::vector<float> l = {0.f, std::log(0.5f), std::log(0.25f), std::log(0.1f)};
  for (const auto& [k, p] : std::vector<std::pair<int64_t, double>>{{0, 1.0}, {3, 1.0}, {0, 0.99}}) {
    SamplerConfig c;
    c.temperature = 1.0;
    c.top_k = k;
    c.top_p = p;
    c.min_p = 0.3;
    c.seed = 11;
    Sampler s(c);
    std::map<int32_t, int> n;
    const int draws = 6000;
    for (int i = 0; i < draws; ++i) ++n[s.sample(l)];
    EXPECT_EQ(n.count(2) + n.count(3), 0u) << "top_k " << k << " top_p " << p;
    EXPECT_NEAR(double(n[0]) / draws, 2.0 / 3.0, 0.03) << "top_k " << k << " top_p " << p;
  }
  SamplerConfig bad;
  bad.min_p = 1.5;
  EXPECT_THROW(validate(bad), Error);
}

// OpenAI's definition (API reference, "presence_penalty" / "frequency_penalty"):
// logit[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty, c[j] the times j was
// sampled. Greedy over logits {3, 2.5, 2.2, 0}: each case's order worked out by hand.
TEST(Sampler, PresencePenaltyMovesGreedyOffADrawnToken) {
  SamplerConfig c;
  c.presence_penalty = 0.6;
  Sampler s(c);
  const std::vector<float> l = {3.f, 2.5f, 2.2f, 0.f};
  std::vector<int32_t> got;
  for (int i = 0; i < 5; ++i) got.push_back(s.sample(l));
  // step 1: {3.0, 2.5, 2.2} -> 0;  step 2: {2.4, 2.5, 2.2} -> 1;  step 3: {2.4, 1.9, 2.2} -> 0;
  // from then on the same (presence does not grow with the count) -> 0.
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 0, 0, 0}));
}

TEST(Sampler, FrequencyPenaltyGrowsWithTheCount) {
  SamplerConfig c;
  c.frequency_penalty = 0.3;  // token 0 after n draws: 3 - 0.3 n; token 1: 2.5 - 0.3 m
  Sampler s(c);
  const std::vector<float> l = {3.f, 2.5f, 2.2f, 0.f};
  std::vector<int32_t> got;
  for (int i = 0; i < 6; ++i) got.push_back(s.sample(l));
  //   step 1: {3.0, 2.5, 2.2} -> 0;  step 2: {2.7, 2.5, 2.2} -> 0;  step 3: {2.4, 2.5, 2.2} -> 1
  //   step 4: {2.4, 2.2, 2.2} -> 0;  step 5: {2.1, 2.2, 2.2} -> 1 (first of the tie)
  //   step 6: {2.1, 1.9, 2.2} -> 2
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 1, 0, 1, 2}));
}

TEST(Sampler, LogitBiasBansAndFavours) {
  const std::vector<float> l = {3.f, 2.5f, 2.2f, 0.f};
  SamplerConfig c;
  c.logit_bias = {{0, -100.f}};
  EXPECT_EQ(Sampler(c).sample(l), 1);
  c.logit_bias = {{3, 3.5f}};  // 0 + 3.5 > 3
  EXPECT_EQ(Sampler(c).sample(l), 3);
  c.logit_bias = {{3, 1.5f}, {3, 1.6f}};  // a repeated id adds up: 3.1 > 3
  EXPECT_EQ(Sampler(c).sample(l), 3);
  c.logit_bias = {{99, 50.f}};  // past this vocabulary: nothing to bias
  EXPECT_EQ(Sampler(c).sample(l), 0);
  // A banned token is never drawn at temperature 1 either (e^-100 of the mass), and the
  // caller's logits are not changed.
  c.temperature = 1.0;
  c.logit_bias = {{0, -100.f}, {1, -100.f}, {2, -100.f}};
  Sampler t(c);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(t.sample(l), 3);
  EXPECT_EQ(l, (std::vector<float>{3.f, 2.5f, 2.2f, 0.f}));
}

}  // namespace
}  // namespace ptllm
