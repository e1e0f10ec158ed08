// cache-table's planner (issue 16): closed-form bytes against real cache
// objects, the bounded steady state as an upper bound, fit / no fit at the
// budget's edge, quality from a perplexity JSON, and bad budget strings.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "eval/cache_table.h"
#include "kv/cache_spec.h"

namespace ptllm {
namespace {

KVCacheShape shape(int64_t capacity) {
  KVCacheShape s;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.capacity = capacity;
  return s;
}

eval::CacheBytes measured(const CacheSpec& spec, int64_t T) {
  auto c = make_cache(shape(T), spec);
  std::mt19937 rng(1);
  std::normal_distribution<float> d;
  std::vector<float> k(size_t(T * 2 * 32)), v(k.size());
  for (auto& x : k) x = d(rng);
  for (auto& x : v) x = d(rng);
  for (int64_t l = 0; l < 2; ++l) c->append(l, k.data(), v.data(), T);
  return {c->payload_bytes(), c->scale_bytes()};
}

std::vector<CacheSpec> specs() {
  std::vector<CacheSpec> all = eval::plan_candidates(shape(1), 2000, 2000);
  CacheSpec a;
  a.storage = KVStorage::Int4;
  a.value_storage = KVStorage::Int2;
  a.kivi_group = 8;
  a.kivi_residual = 16;
  a.residual_dtype = KVStorage::F32;
  all.push_back(a);
  a.kivi_group = 0;  // the simple scheme
  all.push_back(a);
  a = CacheSpec{};
  a.key_storage = KVStorage::F16;
  a.value_storage = KVStorage::Int3;
  a.sink = 4;
  a.window = 700;
  all.push_back(a);
  return all;
}

// Filled from empty (no eviction): the formula is exact.
TEST(CachePlan, PredictedBytesEqualMeasuredCaches) {
  for (const CacheSpec& s : specs())
    for (int64_t T : {1, 3, 50, 159, 160, 161, 200, 252, 333, 600}) {
      if (s.streaming() && T > s.sink + s.window) continue;
      const auto m = measured(s, T);
      const auto p = eval::predicted_cache_bytes(shape(T), s, T);
      ASSERT_EQ(p.payload, m.payload) << s.label(true) << " T " << T;
      ASSERT_EQ(p.scales, m.scales) << s.label(true) << " T " << T;
    }
}

// A bounded cache that evicts never holds more than the steady-state bound,
// and gets close to it (the bound is not loose by more than a group).
TEST(CachePlan, SteadyStateBoundHoldsAtEveryStep) {
  for (KVStorage st : {KVStorage::Int4, KVStorage::Int3, KVStorage::F16})
    for (KeyAxis ax : {KeyAxis::Channel, KeyAxis::Token}) {
      CacheSpec s;
      s.storage = st;
      s.k_axis = ax;
      s.sink = 4;
      s.window = 60;
      s.kivi_group = 8;
      s.kivi_residual = 16;
      const auto bound = eval::predicted_cache_bytes(shape(64), s, 64, true).total();
      auto c = make_cache(shape(64), s);
      std::mt19937 rng(2);
      std::normal_distribution<float> d;
      size_t most = 0;
      for (int64_t p = 0; p < 300; ++p) {
        std::vector<float> k(64), v(64);
        for (auto& x : k) x = d(rng);
        for (auto& x : v) x = d(rng);
        for (int64_t l = 0; l < 2; ++l) c->append(l, k.data(), v.data(), 1);
        c->advance(1);
        const size_t b = c->payload_bytes() + c->scale_bytes();
        ASSERT_LE(b, bound) << s.label(true) << " step " << p;
        most = std::max(most, b);
      }
      EXPECT_GE(double(most), 0.95 * double(bound)) << s.label(true);
    }
}

TEST(CachePlan, FitsExactlyAtTheBudgetAndRanksByQuality) {
  const KVCacheShape sh = shape(1);
  CacheSpec int4;
  int4.storage = KVStorage::Int4;
  CacheSpec fp32;
  const size_t b4 = eval::predicted_cache_bytes(sh, int4, 1000).total();
  const size_t b32 = eval::predicted_cache_bytes(sh, fp32, 1000).total();
  const auto has = [](const eval::Plan& p, const CacheSpec& s) {
    for (const auto& r : p.rows)
      if (r.spec == s.canonical()) return true;
    return false;
  };
  // fp32 fits at exactly its bytes and not one byte less.
  EXPECT_TRUE(has(eval::plan_cache(sh, b32, 1000, 4096, nullptr), fp32));
  EXPECT_FALSE(has(eval::plan_cache(sh, b32 - 1, 1000, 4096, nullptr), fp32));
  // int4 fits a budget fp32 does not.
  const auto p = eval::plan_cache(sh, b4, 1000, 4096, nullptr);
  EXPECT_TRUE(has(p, int4));
  EXPECT_FALSE(has(p, fp32));
  for (const auto& r : p.rows) EXPECT_LE(r.bytes.total(), b4) << r.spec.label(true);
  // Longer than the model context: no unbounded setting, only windows.
  for (const auto& r : eval::plan_cache(sh, b32, 100000, 4096, nullptr).rows) EXPECT_TRUE(r.spec.streaming());
  // Nothing fits 1 byte.
  EXPECT_TRUE(eval::plan_cache(sh, 1, 1000, 4096, nullptr).rows.empty());
  // Quality: measured settings first, best (lowest KLD) first; KLD is used
  // over ppl; a setting the file lacks is not measured.
  CacheSpec int2;
  int2.storage = KVStorage::Int2;
  CacheSpec int8;
  int8.storage = KVStorage::Int8;
  nlohmann::json q = {{"results",
                       {{{"kv_cache", int2.to_json()}, {"through_cache", {{"ppl", 30.0}, {"kl_divergence", {{"mean", 0.09}}}}}},
                        {{"kv_cache", int8.to_json()}, {"through_cache", {{"ppl", 27.5}, {"kl_divergence", {{"mean", 0.001}}}}}},
                        {{"kv_cache", {{"quantize", "int9"}}}, {"through_cache", {{"ppl", 1.0}}}}}}};
  const auto pq = eval::plan_cache(sh, b32, 1000, 4096, &q);
  EXPECT_EQ(pq.metric, "kl_divergence.mean");
  ASSERT_GE(pq.rows.size(), 3u);
  EXPECT_EQ(pq.rows[0].spec, int8.canonical());
  EXPECT_DOUBLE_EQ(*pq.rows[0].quality, 0.001);
  EXPECT_EQ(pq.rows[1].spec, int2.canonical());
  EXPECT_FALSE(pq.rows[2].quality.has_value());
  // A file that is not a perplexity JSON is an error naming --quality.
  const nlohmann::json bad = nlohmann::json::array();
  try {
    eval::plan_cache(sh, b32, 1000, 4096, &bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--quality"), std::string::npos) << e.what();
  }
}

TEST(CachePlan, ByteSizes) {
  EXPECT_EQ(eval::parse_byte_size("67108864"), 67108864u);
  EXPECT_EQ(eval::parse_byte_size("64MiB"), 67108864u);
  EXPECT_EQ(eval::parse_byte_size("64 MiB"), 67108864u);
  EXPECT_EQ(eval::parse_byte_size("64M"), 67108864u);
  EXPECT_EQ(eval::parse_byte_size("1.5GiB"), 1610612736u);
  EXPECT_EQ(eval::parse_byte_size("500MB"), 500000000u);
  EXPECT_EQ(eval::parse_byte_size("2KB"), 2000u);
  for (const char* bad : {"", "abc", "-5", "0", "0.1", "1.2.3", "64XB", "64MiBs", "MiB", "1e3", " 64"}) {
    try {
      eval::parse_byte_size(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string("--budget ") + bad + ":", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace ptllm
