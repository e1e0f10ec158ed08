// The stores' one attention interface (KVStore::key_scores / value_sum), for
// every storage and scheme, after evictions that wrap the rings: the scores and
// sums must be those of the rows the store hands back with read() (as the cache
// would stage them: pre-RoPE keys turned by their slot), computed here in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kv/cache_spec.h"
#include "kv/kv_store.h"
#include "test_util.h"

namespace ptllm {
namespace {

using test::randn;

struct Case {
  KVStorage storage;
  int64_t group;  // 0: the simple KIVI scheme (quantised storages only)
};

TEST(StoreAttention, ScoresAndSumsAreThoseOfTheStoredRows) {
  const int64_t H = 2, cap = 24, hd = 32, half = hd / 2, sink = 2, steps = 61;
  std::vector<Case> cases;
  for (KVStorage s : kAllStorages) {
    cases.push_back({s, 4});
    if (is_quantised(s)) cases.push_back({s, 0});
  }
  // cos/sin table of slots, [cap, half].
  std::vector<float> kcos(size_t(cap * half)), ksin(kcos.size());
  for (int64_t t = 0; t < cap; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float a = float(t) * std::pow(100.f, -float(i) / float(half));
      kcos[size_t(t * half + i)] = std::cos(a);
      ksin[size_t(t * half + i)] = std::sin(a);
    }
  for (const Case& c : cases)
    for (bool key : {true, false}) {
      CacheSpec o;
      o.storage = c.storage;
      o.kivi_group = c.group;
      o.kivi_residual = c.group > 0 ? 8 : 0;
      auto st = make_store(key, o, sink, H, cap, hd);
      // StreamingLLM's pattern: once full, drop the oldest non-sink slot per token.
      for (int64_t t = 0; t < steps; ++t) {
        if (st->size() == cap) st->evict(sink, sink + 1);
        const auto x = randn(size_t(H * hd), uint64_t(t) + 1);
        st->append(x.data(), 1);
      }
      ASSERT_EQ(st->size(), cap);
      const bool prerope = key && is_quantised(c.storage);
      const std::string what = std::string(storage_name(c.storage)) + (c.group ? " grouped " : " simple ") +
                               (key ? "K" : "V");
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> rows(size_t(cap * hd));
        st->read(h, rows.data());
        // What the cache stages for stores that are not read in place.
        std::vector<float> staged = rows;
        if (prerope)
          for (int64_t t = 0; t < cap; ++t)
            for (int64_t i = 0; i < half; ++i) {
              float* r = &staged[size_t(t * hd)];
              const float a = r[i], b = r[i + half], cs = kcos[size_t(t * half + i)], sn = ksin[size_t(t * half + i)];
              r[i] = a * cs - b * sn;
              r[i + half] = b * cs + a * sn;
            }
        const float* stage = st->reads_in_place() ? nullptr : staged.data();
        const auto q = randn(size_t(hd), uint64_t(h) + 100);
        if (key) {
          const int64_t begin = 1, end = cap - 3;  // a run of slots, not the whole store
          std::vector<float> got(size_t(cap), NAN);
          st->key_scores(h, stage, q.data(), begin, end, prerope ? kcos.data() : nullptr,
                         prerope ? ksin.data() : nullptr, 0.5f, got.data());
          for (int64_t t = begin; t < end; ++t) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < half; ++i) {
              const double a = rows[size_t(t * hd + i)], b = rows[size_t(t * hd + i + half)];
              const double cs = prerope ? kcos[size_t(t * half + i)] : 1, sn = prerope ? ksin[size_t(t * half + i)] : 0;
              const double lo = a * cs - b * sn, hi = b * cs + a * sn;
              ref += q[size_t(i)] * lo + q[size_t(i + half)] * hi;
              mag += (std::fabs(q[size_t(i)]) + std::fabs(q[size_t(i + half)])) * (std::fabs(a) + std::fabs(b));
            }
            ASSERT_NEAR(got[size_t(t)], 0.5 * ref, 1e-5 * mag + 1e-6) << what << " slot " << t;
          }
          for (int64_t t : {int64_t(0), end}) EXPECT_TRUE(std::isnan(got[size_t(t)])) << what << ": wrote slot " << t;
        } else {
          auto p = randn(size_t(cap), uint64_t(h) + 200);
          for (auto& x : p) x = std::fabs(x);
          p[3] = 0.f;
          const int64_t len = cap - 2;
          std::vector<float> got(size_t(hd), NAN);
          st->value_sum(h, stage, p.data(), len, got.data());
          for (int64_t i = 0; i < hd; ++i) {
            double ref = 0, mag = 0;
            for (int64_t t = 0; t < len; ++t) {
              ref += p[size_t(t)] * double(rows[size_t(t * hd + i)]);
              mag += std::fabs(p[size_t(t)] * double(rows[size_t(t * hd + i)]));
            }
            ASSERT_NEAR(got[size_t(i)], ref, 1e-5 * mag + 1e-6) << what << " channel " << i;
          }
        }
      }
    }
}

}  // namespace
}  // namespace ptllm
