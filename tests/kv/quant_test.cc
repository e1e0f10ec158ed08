// KIVI quantiser: round-trip bound, the NaN traps (zero range, fp16 scale
// arithmetic, collapsed clamp range, integer codes reaching attention) and
// awkward inputs (constant channel, all-zero K, +-1e4, denormals).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <type_traits>

#include "kv/cache_options.h"
#include "kv/quant.h"
#include "kv/reference_cache.h"
#include "kv/storage_cache.h"

namespace ptllm {
namespace {

using kivi::Half;
using kivi::kInt4Range;
using kivi::kInt8Range;
using kivi::QuantRange;

// Round-trip bound: |x - x'| <= scale/2 (scale = the stored fp16 scale), plus
// fp32 rounding of the dequantise arithmetic (a few ulps of |x| and of zero).
void expect_within_half_scale(float x, float back, float scale, float zero) {
  ASSERT_TRUE(std::isfinite(back)) << x;
  const float slack = 4e-7f * (std::fabs(x) + std::fabs(zero)) + 1e-12f;
  EXPECT_LE(std::fabs(x - back), 0.5f * scale + slack) << "x=" << x << " scale=" << scale << " zero=" << zero;
}

// One row quantised with its own parameters (the V / per-token path).
void check_row(const std::vector<float>& x, QuantRange r) {
  float lo = INFINITY, hi = -INFINITY;
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  const kivi::WideParams w = kivi::widen(kivi::choose_params(lo, hi, r));
  ASSERT_GE(w.scale, kivi::kScaleFloor);
  std::vector<uint8_t> u(x.size()), packed(kivi::row_bytes(int64_t(x.size()), r));
  for (size_t i = 0; i < x.size(); ++i) u[i] = kivi::quantise(x[i], w, r);
  kivi::pack_row(u.data(), int64_t(x.size()), r, packed.data());
  std::vector<float> back(x.size());
  kivi::dequantise_row(packed.data(), int64_t(x.size()), r, w, back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(kivi::code_at(packed.data(), int64_t(i), r), u[i]);
    ASSERT_LE(int(u[i]), r.levels());
    expect_within_half_scale(x[i], back[i], w.scale, w.zero);
  }
}

TEST(KiviQuant, RoundTripWithinHalfScale) {
  std::mt19937 rng(42);
  for (QuantRange r : {kInt8Range, kInt4Range})
    for (float spread : {1e-3f, 0.1f, 1.f, 30.f, 1000.f})
      for (float offset : {0.f, -3.f, 250.f})
        for (int n : {1, 7, 32, 128}) {
          std::normal_distribution<float> d(offset, spread);
          std::vector<float> x(static_cast<size_t>(n));
          for (auto& v : x) v = d(rng);
          check_row(x, r);
        }
}

// The K path: per-channel parameters over all tokens of one append.
TEST(KiviQuant, KeyStorePerChannelRoundTrip) {
  std::mt19937 rng(7);
  const int64_t H = 2, T = 50, D = 16;
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    kivi::QuantRange rr = r;
    KiviKeyStore ks(rr, H, T, D);
    std::vector<float> x(static_cast<size_t>(T * H * D));
    // Channels with very different ranges: the case per-channel scales are for.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < D; ++c)
          x[size_t((t * H + h) * D + c)] = std::normal_distribution<float>(float(c), 0.1f + float(c))(rng);
    ks.append(x.data(), T);
    std::vector<float> back(static_cast<size_t>(T * D));
    for (int64_t h = 0; h < H; ++h) {
      ks.read(h, back.data());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < D; ++c) {
          const auto w = kivi::widen(ks.params(h, c));
          expect_within_half_scale(x[size_t((t * H + h) * D + c)], back[size_t(t * D + c)], w.scale, w.zero);
        }
    }
  }
}

// NaN trap 1: zero range. A constant channel has max == min; without the floor
// the scale would be 0 and (x - zero) / scale = 0/0.
TEST(KiviQuant, ZeroRangeUsesScaleFloor) {
  for (QuantRange r : {kInt8Range, kInt4Range})
    for (float c : {0.3f, -7.25f, 1e4f, 0.f}) {
      const kivi::AffineParams p = kivi::choose_params(c, c, r);
      const kivi::WideParams w = kivi::widen(p);
      EXPECT_GE(w.scale, kivi::kScaleFloor);
      EXPECT_LE(w.scale, 1.01f * kivi::kScaleFloor + std::fabs(c) * 1e-3f / float(r.levels()));
      EXPECT_TRUE(std::isfinite(w.inv_scale));
      const float back = kivi::dequantise(kivi::quantise(c, w, r), w);
      expect_within_half_scale(c, back, w.scale, w.zero);
    }
}

TEST(KiviQuant, ConstantChannelThroughKeyStore) {
  const int64_t T = 20, D = 8;
  KiviKeyStore ks(kInt4Range, 1, T, D);
  std::vector<float> x(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) x[size_t(t * D + c)] = c == 3 ? 2.5f : float(t) * 0.1f - float(c);
  ks.append(x.data(), T);
  std::vector<float> back(x.size());
  ks.read(0, back.data());
  for (int64_t t = 0; t < T; ++t) {
    ASSERT_TRUE(std::isfinite(back[size_t(t * D + 3)]));
    EXPECT_NEAR(back[size_t(t * D + 3)], 2.5f, 0.5f * kivi::widen(ks.params(0, 3)).scale);
  }
}

TEST(KiviQuant, AllZeroKeysStayZero) {
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    KiviKeyStore ks(r, 2, 16, 8);
    KiviValueStore vs(r, 2, 16, 8);
    std::vector<float> x(16 * 2 * 8, 0.f), back(16 * 8, 1.f);
    ks.append(x.data(), 16);
    vs.append(x.data(), 16);
    for (int64_t h = 0; h < 2; ++h) {
      ks.read(h, back.data());
      for (float v : back) EXPECT_EQ(v, 0.f);
      vs.read(h, back.data());
      for (float v : back) EXPECT_EQ(v, 0.f);
    }
  }
}

TEST(KiviQuant, LargeMagnitudesStayFinite) {
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    check_row({1e4f, -1e4f, 0.f, 5000.f, -9999.5f, 1e4f}, r);
    check_row({1e4f, 1e4f + 3.f, 1e4f + 1.f}, r);  // range far below fp16 spacing at 1e4
    check_row({-1e4f, -1e4f, -1e4f}, r);
  }
}

TEST(KiviQuant, DenormalsStayFinite) {
  const float dmin = std::numeric_limits<float>::denorm_min();
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    check_row({dmin, -dmin, 1e-40f, -3e-39f, 0.f}, r);
    check_row({1e-40f, 1e-40f}, r);
    check_row({-1e-39f, 1.f}, r);
  }
}

// Out-of-range and non-finite inputs clamp to a valid code.
TEST(KiviQuant, ClampKeepsCodesInRange) {
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    const kivi::WideParams w = kivi::widen(kivi::choose_params(-1.f, 1.f, r));
    for (float x : {INFINITY, -INFINITY, NAN, 1e30f, -1e30f}) {
      const uint8_t u = kivi::quantise(x, w, r);
      EXPECT_LE(int(u), r.levels());
      EXPECT_TRUE(std::isfinite(kivi::dequantise(u, w)));
    }
  }
}

// NaN trap 2: fp16 scales used without widening. Half has no arithmetic at
// all, so `scale * x` on the stored form does not compile...
template <typename A, typename B>
concept Multipliable = requires(A a, B b) { a * b; };
template <typename A, typename B>
concept Subtractable = requires(A a, B b) { a - b; };
static_assert(!Multipliable<Half, float> && !Multipliable<float, Half> && !Subtractable<float, Half>,
              "fp16 scales must be widened before arithmetic");
static_assert(!std::is_convertible_v<Half, float>, "no implicit widening either: it must be explicit");

// ...and the widened path keeps the bound where fp16 arithmetic would not:
// zero = 1000 with a fine scale; in fp16, 1000 + u*scale rounds to a 0.5 grid.
TEST(KiviQuant, Fp16ScalesAreWidenedBeforeArithmetic) {
  std::vector<float> x;
  for (int i = 0; i <= 50; ++i) x.push_back(1000.f + 0.01f * float(i));
  const kivi::AffineParams p = kivi::choose_params(1000.f, 1000.5f, kInt8Range);
  const kivi::WideParams w = kivi::widen(p);
  float worst_fp16 = 0;
  for (float v : x) {
    const uint8_t u = kivi::quantise(v, w, kInt8Range);
    expect_within_half_scale(v, kivi::dequantise(u, w), w.scale, w.zero);
    // What dequantising in fp16 arithmetic would give (each operation rounded to fp16).
    const float prod = f16_to_f32(f32_to_f16(float(u) * w.scale));
    const float fp16_result = f16_to_f32(f32_to_f16(prod + w.zero));
    worst_fp16 = std::max(worst_fp16, std::fabs(fp16_result - v));
  }
  EXPECT_GT(worst_fp16, 0.5f * w.scale) << "the fp16 emulation should break the bound (test sanity)";
}

// NaN trap 3: a collapsed clamp range (qmax == qmin) divides by zero in the
// scale. The ranges are named constants checked at compile time (quant.h);
// here: the full code range is used, min -> qmin and max -> qmax.
TEST(KiviQuant, ClampRangeIsFullAndNotCollapsed) {
  static_assert(kInt8Range.qmin == -128 && kInt8Range.qmax == 127 && kInt8Range.bits == 8);
  static_assert(kInt4Range.qmin == -8 && kInt4Range.qmax == 7 && kInt4Range.bits == 4);
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    ASSERT_GT(r.levels(), 0);
    const kivi::WideParams w = kivi::widen(kivi::choose_params(-2.f, 3.f, r));
    EXPECT_EQ(int(kivi::quantise(-2.f, w, r)) + r.qmin, r.qmin);
    EXPECT_EQ(int(kivi::quantise(3.f, w, r)) + r.qmin, r.qmax);
  }
  // int4 really is two codes per byte.
  EXPECT_EQ(kivi::row_bytes(32, kInt4Range), 16u);
  EXPECT_EQ(kivi::row_bytes(33, kInt4Range), 17u);
  EXPECT_EQ(kivi::row_bytes(32, kInt8Range), 32u);
}

// NaN trap 4: integer K/V reaching attention. The attention kernel and the
// store read-back only take/give fp32 pointers, so codes cannot be passed...
static_assert(!std::is_invocable_v<decltype(&attend_head), const float*, const uint8_t*, const uint8_t*, int64_t,
                                   int64_t, const int64_t*, int64_t, int64_t, float*, float*>,
              "attention must not accept integer K/V");
static_assert(!std::is_invocable_v<decltype(&attend_head), const float*, const int8_t*, const int8_t*, int64_t,
                                   int64_t, const int64_t*, int64_t, int64_t, float*, float*>,
              "attention must not accept integer K/V");
static_assert(std::is_invocable_v<decltype(&attend_head), const float*, const float*, const float*, int64_t, int64_t,
                                  const int64_t*, int64_t, int64_t, float*, float*>);

// ...and the quantised cache's attention equals fp32 attention over exactly
// the dequantised (then rotated) K and V.
TEST(KiviQuant, QuantisedCacheAttendsOverDequantisedFloats) {
  KVCacheShape s;
  s.n_layers = 1;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.capacity = 40;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.f, 1.f);
  for (KVStorage st : {KVStorage::Int8, KVStorage::Int4}) {
    CacheOptions o;
    o.storage = st;
    auto cache = make_cache(s, o);
    auto& sc = dynamic_cast<StorageKVCache&>(*cache);
    const int64_t T = 30, row = s.n_kv_heads * s.head_dim, qrow = s.n_heads * s.head_dim;
    std::vector<float> k(static_cast<size_t>(T * row)), v(k.size()), q(static_cast<size_t>(qrow)), out(static_cast<size_t>(qrow)), ref(static_cast<size_t>(qrow));
    for (auto& x : k) x = 3.f * d(rng);
    for (auto& x : v) x = d(rng);
    for (auto& x : q) x = d(rng);
    cache->append(0, k.data(), v.data(), T - 1);
    cache->advance(T - 1);
    cache->append(0, k.data() + (T - 1) * row, v.data() + (T - 1) * row, 1);
    cache->attend(0, q.data(), 1, out.data());
    // Reference: fp32 attention over read_keys()/read_values() rotated at their slots.
    std::vector<float> rq = q;
    cache->rope().apply(rq.data(), s.n_heads, double(T - 1));
    std::vector<int64_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = t;
    std::vector<float> scores(static_cast<size_t>(T));
    for (int64_t h = 0; h < s.n_heads; ++h) {
      const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
      std::vector<float> kk = sc.read_keys(0, kvh), vv = sc.read_values(0, kvh);
      for (int64_t t = 0; t < T; ++t) cache->rope().apply(kk.data() + t * s.head_dim, 1, double(t));
      attend_head(rq.data() + h * s.head_dim, kk.data(), vv.data(), T, s.head_dim, pos.data(), T - 1, 0,
                  scores.data(), ref.data() + h * s.head_dim);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i]));
      EXPECT_NEAR(out[i], ref[i], 1e-5f * (1.f + std::fabs(ref[i])));
    }
  }
}

}  // namespace
}  // namespace ptllm

namespace ptllm {
namespace {

// The key store keeps the codes of channels whose parameters did not change
// instead of re-quantising them; that must equal the literal simple scheme
// (dequantise all, append, choose parameters over all, re-quantise all), here
// recomputed from read() over a stream of appends and evictions.
TEST(KiviQuant, KeyStoreMatchesLiteralRequantisation) {
  const int64_t H = 2, D = 8, cap = 24;
  std::mt19937 rng(5);
  for (QuantRange r : {kInt8Range, kInt4Range}) {
    KiviKeyStore ks(r, H, cap, D);
    for (int step = 0; step < 200; ++step) {
      if (ks.size() + 1 > cap) ks.evict(2, 3);
      std::vector<float> before(static_cast<size_t>(H * (ks.size() + 1) * D));
      std::vector<float> x(static_cast<size_t>(H * D));
      // Occasional outliers move the range; most steps stay inside it.
      for (auto& v : x) v = std::normal_distribution<float>(0.f, step % 17 == 0 ? 4.f : 1.f)(rng);
      const int64_t old = ks.size();
      for (int64_t h = 0; h < H; ++h) ks.read(h, before.data() + h * (old + 1) * D);
      ks.append(x.data(), 1);
      std::vector<float> got(static_cast<size_t>((old + 1) * D));
      for (int64_t h = 0; h < H; ++h) {
        float* all = before.data() + h * (old + 1) * D;
        std::copy_n(x.data() + h * D, D, all + old * D);
        ks.read(h, got.data());
        for (int64_t c = 0; c < D; ++c) {
          float lo = INFINITY, hi = -INFINITY;
          for (int64_t t = 0; t <= old; ++t) lo = std::min(lo, all[t * D + c]), hi = std::max(hi, all[t * D + c]);
          const auto w = kivi::widen(kivi::choose_params(lo, hi, r));
          for (int64_t t = 0; t <= old; ++t) {
            const float expect = kivi::dequantise(kivi::quantise(all[t * D + c], w, r), w);
            ASSERT_NEAR(got[size_t(t * D + c)], expect, 1e-6f * (1.f + std::fabs(expect)))
                << "int" << r.bits << " step " << step << " head " << h << " slot " << t << " channel " << c;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ptllm
