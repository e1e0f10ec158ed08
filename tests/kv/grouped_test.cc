// Grouped KIVI (issue 6): per-group K scales, full-precision residual and
// sinks, int2 packing, slicing eviction, asymmetric K/V, and the fused
// attention kernels against dequantise-then-attend.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "core/error.h"
#include "kv/cache_spec.h"
#include "kv/grouped_store.h"
#include "kv/rotation.h"
#include "kv/reference_cache.h"
#include "kv/storage_cache.h"
#include "ops/ops.h"

namespace ptllm {
namespace {

using Axis = GroupedKiviStore::Axis;
constexpr kivi::QuantRange kRanges[] = {kivi::kInt8Range, kivi::kInt4Range, kivi::kInt3Range, kivi::kInt2Range};

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

// int2: four codes per byte, low bits first; odd lengths keep their tail.
TEST(Int2, PackingRoundTrip) {
  std::mt19937 rng(1);
  for (int64_t n : {1, 2, 3, 4, 5, 7, 31, 32, 33, 64}) {
    std::vector<uint8_t> u(static_cast<size_t>(n));
    for (auto& x : u) x = uint8_t(rng() % 4);
    std::vector<uint8_t> packed(kivi::row_bytes(n, kivi::kInt2Range), 0xff);
    ASSERT_EQ(packed.size(), size_t((n + 3) / 4));
    kivi::pack_row(u.data(), n, kivi::kInt2Range, packed.data());
    uint8_t tmp[512];
    const uint8_t* back = kivi::unpack_row(packed.data(), n, kivi::kInt2Range, tmp);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(kivi::code_at(packed.data(), i, kivi::kInt2Range), u[size_t(i)]) << n << " " << i;
      ASSERT_EQ(back[i], u[size_t(i)]) << n << " " << i;
    }
    // set_code touches only its own two bits.
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t nu = uint8_t((u[size_t(i)] + 1) % 4);
      kivi::set_code(packed.data(), i, nu, kivi::kInt2Range);
      u[size_t(i)] = nu;
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(kivi::code_at(packed.data(), j, kivi::kInt2Range), u[size_t(j)]);
    }
  }
  // Element 4j+k sits in bits 2k..2k+1 of byte j.
  const uint8_t u[4] = {1, 2, 3, 0};
  uint8_t b = 0;
  kivi::pack_row(u, 4, kivi::kInt2Range, &b);
  EXPECT_EQ(b, uint8_t(1 | (2 << 2) | (3 << 4)));
}

// int3: eight codes per three bytes, element i in bits 3i..3i+2 of the row's
// little-endian bit stream; any length, set_code touches only its own bits.
TEST(Int3, PackingRoundTrip) {
  std::mt19937 rng(2);
  const kivi::QuantRange r = kivi::kInt3Range;
  for (int64_t n : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 64, 256}) {
    std::vector<uint8_t> u(static_cast<size_t>(n));
    for (auto& x : u) x = uint8_t(rng() % 8);
    std::vector<uint8_t> packed(kivi::row_bytes(n, r), 0xff);
    ASSERT_EQ(packed.size(), size_t((3 * n + 7) / 8));
    kivi::pack_row(u.data(), n, r, packed.data());
    uint8_t tmp[512];
    const uint8_t* back = kivi::unpack_row(packed.data(), n, r, tmp);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(kivi::code_at(packed.data(), i, r), u[size_t(i)]) << n << " " << i;
      ASSERT_EQ(back[i], u[size_t(i)]) << n << " " << i;
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t nu = uint8_t((u[size_t(i)] + 3) % 8);
      kivi::set_code(packed.data(), i, nu, r);
      u[size_t(i)] = nu;
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(kivi::code_at(packed.data(), j, r), u[size_t(j)]) << n << " " << i;
    }
  }
  // Codes 0..7 in order: the 24-bit word is sum_k k << 3k = 0xFAC688.
  const uint8_t u[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  uint8_t b[3] = {};
  kivi::pack_row(u, 8, r, b);
  EXPECT_EQ(b[0], 0x88);
  EXPECT_EQ(b[1], 0xC6);
  EXPECT_EQ(b[2], 0xFA);
}

// Round trip of a grouped K store: every quantised element within scale/2 of
// its group's (channel) scale; residual rows exact; flush exactly at R + G.
TEST(GroupedKivi, RoundTripAndResidualFlushAtGroupBoundary) {
  const int64_t H = 2, D = 16, G = 8, R = 16, T = 100;
  std::mt19937 rng(2);
  const auto x = randn(size_t(T * H * D), rng, 2.f);
  for (kivi::QuantRange r : kRanges)
    for (Axis ax : {Axis::PerChannel, Axis::PerToken}) {
      GroupedKiviStore st(ax, r, H, T, D, 0, G, R);
      for (int64_t t = 0; t < T; ++t) {
        st.append(x.data() + t * H * D, 1);
        const int64_t n = t + 1;
        // Nothing is quantised before the residual reaches R + G; then G at a time.
        const int64_t q = n < R + G ? 0 : (n - R) / G * G;
        ASSERT_EQ(st.n_quant(), q) << "after " << n;
        ASSERT_EQ(st.n_resid(), n - q);
        ASSERT_GE(st.n_resid(), std::min(n, R));
        ASSERT_LT(st.n_resid(), R + G);
      }
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> back(static_cast<size_t>(T * D));
        st.read(h, back.data());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < D; ++c) {
            const float v = x[size_t((t * H + h) * D + c)], b = back[size_t(t * D + c)];
            if (t >= st.n_quant()) {
              ASSERT_EQ(b, v) << "residual row " << t << " must be exact fp32";
              continue;
            }
            const float scale = ax == Axis::PerChannel ? st.group_params(h, t / G)[c].scale.widen()
                                                       : st.token_params(h, t).scale.widen();
            ASSERT_LE(std::fabs(b - v), 0.5f * scale * (1 + 1e-5f)) << "int" << r.bits << " t " << t;
          }
      }
    }
}

// A quantised token is never re-quantised: codes and parameters of a group are
// bit-identical after any number of later appends (and evictions of others).
TEST(GroupedKivi, QuantisedGroupsAreNeverTouchedAgain) {
  const int64_t H = 2, D = 8, G = 4, R = 8, T = 200;
  std::mt19937 rng(3);
  for (kivi::QuantRange r : kRanges) {
    GroupedKiviStore k(Axis::PerChannel, r, H, T, D, 0, G, R);
    // First group: small values; later tokens are 100x larger (a simple
    // scheme would widen the channel ranges and re-round these codes).
    auto x0 = randn(size_t((R + G) * H * D), rng, 0.1f);
    k.append(x0.data(), R + G);
    ASSERT_EQ(k.n_quant(), G);
    const std::vector<uint8_t> codes0(k.code_row(1, 0), k.code_row(1, 0) + G * k.row_bytes());
    std::vector<uint16_t> p0;
    for (int64_t c = 0; c < D; ++c) p0.push_back(k.group_params(1, 0)[c].scale.bits());
    for (int64_t c = 0; c < D; ++c) p0.push_back(k.group_params(1, 0)[c].zero.bits());
    for (int64_t i = 0; i < 150; ++i) {
      auto xi = randn(size_t(H * D), rng, 10.f);
      k.append(xi.data(), 1);
      ASSERT_EQ(std::vector<uint8_t>(k.code_row(1, 0), k.code_row(1, 0) + G * k.row_bytes()), codes0) << "int" << r.bits;
      for (int64_t c = 0; c < D; ++c) {
        ASSERT_EQ(k.group_params(1, 0)[c].scale.bits(), p0[size_t(c)]);
        ASSERT_EQ(k.group_params(1, 0)[c].zero.bits(), p0[size_t(D + c)]);
      }
    }
  }
}

// StreamingLLM with groups, every step: stored == min(position, N+M) in every
// layer, slots are the N sinks + the last M positions, sinks read back exactly,
// and every kept token reads back the same value at every step it is stored
// (eviction slices groups; nothing is re-quantised).
TEST(GroupedKivi, EvictionAcrossGroupBoundariesKeepsBoundAndValues) {
  KVCacheShape s;
  s.n_layers = 2;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.capacity = 1000;
  const int64_t N = 3, M = 37, row = s.n_kv_heads * s.head_dim;
  std::mt19937 rng(4);
  for (int64_t G : {4, 8, 5}) {
    CacheSpec o;
    o.storage = KVStorage::Int4;
    o.sink = N;
    o.window = M;
    o.kivi_group = G;
    o.kivi_residual = 2 * G;
    o.residual_dtype = KVStorage::F32;  // sinks read back bit-exact (fp16 sinks: ResidualDtype* below)
    auto cache = make_cache(s, o);
    auto& sc = dynamic_cast<StorageKVCache&>(*cache);
    std::vector<std::vector<float>> ks;  // pre-RoPE keys by position
    std::map<int64_t, std::vector<float>> seen_k, seen_v;  // last read-back by position
    std::map<int64_t, int> changes;
    for (int64_t p = 0; p < 300; ++p) {
      auto k = randn(size_t(row), rng), v = randn(size_t(row), rng), q = randn(size_t(s.n_heads * s.head_dim), rng);
      ks.push_back(k);
      std::vector<float> out(q.size());
      for (int64_t l = 0; l < s.n_layers; ++l) {
        cache->append(l, k.data(), v.data(), 1);
        cache->attend(l, q.data(), 1, out.data());
      }
      cache->advance(1);
      for (int64_t l = 0; l < s.n_layers; ++l) {
        const int64_t len = std::min(p + 1, N + M);
        ASSERT_EQ(cache->stored(l), len) << "G " << G << " step " << p;
        const auto& sp = sc.slot_positions(l);
        for (int64_t t = 0; t < len; ++t) ASSERT_EQ(sp[size_t(t)], t < N ? t : p + 1 - len + t);
        const auto rk = sc.read_keys(l, 0), rv = sc.read_values(l, 0);
        for (int64_t t = 0; t < len; ++t) {
          const int64_t pos = sp[size_t(t)];
          std::vector<float> kt(rk.begin() + t * row, rk.begin() + (t + 1) * row);
          std::vector<float> vt(rv.begin() + t * row, rv.begin() + (t + 1) * row);
          if (pos < N) ASSERT_EQ(kt, ks[size_t(pos)]) << "sink " << pos << " must stay exact";
          if (l == 0) {
            // A token's read-back changes at most once: when it leaves the
            // fp32 residual for a group. Eviction of others never changes it.
            auto it = seen_k.find(pos);
            if (it == seen_k.end()) {
              seen_k[pos] = kt;
              seen_v[pos] = vt;
            } else if (it->second != kt || seen_v[pos] != vt) {
              ASSERT_EQ(changes[pos]++, 0) << "G " << G << " position " << pos << " changed twice (step " << p << ")";
              it->second = kt;
              seen_v[pos] = vt;
            }
          }
        }
      }
    }
  }
}

// The reference: dequantise every stored token (read()), rotate keys at their
// slot (reposition) or original position (absolute), attend in fp32. Quantised
// keys are stored before RoPE; plain keys are stored rotated at their position
// (so reposition turns them by slot - position more).
void reference_attend(StorageKVCache& sc, int64_t layer, const float* q, RopeMode rm, int64_t window, float* out) {
  const auto& s = sc.shape();
  const int64_t len = sc.stored(layer), D = s.head_dim;
  const auto& sp = sc.slot_positions(layer);
  std::vector<float> K(static_cast<size_t>(s.n_kv_heads * len * D)), V(K.size());
  for (int64_t h = 0; h < s.n_kv_heads; ++h) {
    auto k = sc.read_keys(layer, h), v = sc.read_values(layer, h);
    // rotate hadamard: stored M R(pos) k and M v; turned back by M^T here.
    if (const HadamardRotation* m = sc.rotation(layer, h))
      for (int64_t t = 0; t < len; ++t) {
        m->inverse(k.data() + t * D);
        m->inverse(v.data() + t * D);
      }
    for (int64_t t = 0; t < len; ++t) {
      const double at = rm == RopeMode::Reposition ? double(t) : double(sp[size_t(t)]);
      const double stored_at = sc.keys_prerope() ? 0.0 : double(sp[size_t(t)]);
      if (at != stored_at) sc.rope().apply(k.data() + t * D, 1, at - stored_at);
      std::copy_n(k.data() + t * D, D, K.data() + (h * len + t) * D);
      std::copy_n(v.data() + t * D, D, V.data() + (h * len + t) * D);
    }
  }
  std::vector<float> rq(q, q + s.n_heads * D);
  const int64_t qpos = rm == RopeMode::Reposition ? len - 1 : sp[size_t(len - 1)];
  sc.rope().apply(rq.data(), s.n_heads, double(qpos));
  attend_fp32(rq.data(), s.n_heads, s.n_kv_heads, D, K.data(), V.data(), len, sp.data(), len, sp[size_t(len - 1)],
              window, out);
}

// Fused attention (q.k and p.v from the packed codes) equals
// dequantise-then-attend within 1e-5 relative (|a - b| <= 1e-5 * max|ref| of
// the step): int8/int4/int2, asymmetric K/V, sinks, eviction (the rings wrap
// many times), both RoPE modes, a model sliding window on an unbounded cache;
// plain fp32/fp16/bf16 keys (stored rotated, the query turned per run of
// slots); head_dim 16 (scalar K kernel), 32 and 64 (SIMD K kernels), at every
// SIMD level this CPU has (scalar reference, AVX2, AVX-512).
TEST(GroupedKivi, FusedAttentionEqualsDequantiseThenAttend) {
  struct Case {
    KVStorage k, v;
    int64_t sink, window, model_window;
    RopeMode rm;
    KVRotate rot = KVRotate::None;
    KeyAxis axis = KeyAxis::Channel;
  };
  const Case cases[] = {
      {KVStorage::Int8, KVStorage::Int8, 0, 0, 0, RopeMode::Reposition},
      {KVStorage::Int4, KVStorage::Int4, 4, 29, 0, RopeMode::Reposition},
      {KVStorage::Int2, KVStorage::Int2, 4, 29, 0, RopeMode::Absolute},
      {KVStorage::Int4, KVStorage::Int2, 2, 40, 0, RopeMode::Reposition},
      {KVStorage::Int3, KVStorage::Int3, 4, 29, 0, RopeMode::Reposition},
      {KVStorage::Int3, KVStorage::Int3, 0, 0, 0, RopeMode::Absolute},
      {KVStorage::Int3, KVStorage::Int8, 2, 40, 0, RopeMode::Absolute},
      {KVStorage::F32, KVStorage::Int4, 2, 40, 0, RopeMode::Absolute},
      {KVStorage::Int8, KVStorage::F16, 0, 0, 0, RopeMode::Absolute},
      {KVStorage::Int4, KVStorage::Int4, 0, 0, 23, RopeMode::Reposition},
      {KVStorage::F32, KVStorage::F32, 4, 29, 0, RopeMode::Reposition},
      {KVStorage::BF16, KVStorage::Int4, 2, 40, 0, RopeMode::Reposition},
      {KVStorage::F16, KVStorage::F16, 0, 0, 23, RopeMode::Reposition},
      {KVStorage::F32, KVStorage::F32, 0, 0, 23, RopeMode::Absolute},
      // Per-token keys and the Hadamard rotation (keys stored after RoPE).
      {KVStorage::Int4, KVStorage::Int4, 0, 0, 0, RopeMode::Reposition, KVRotate::None, KeyAxis::Token},
      {KVStorage::Int4, KVStorage::Int4, 4, 29, 0, RopeMode::Reposition, KVRotate::Hadamard},
      {KVStorage::Int4, KVStorage::Int4, 4, 29, 0, RopeMode::Absolute, KVRotate::Hadamard, KeyAxis::Token},
      {KVStorage::Int3, KVStorage::Int2, 0, 0, 23, RopeMode::Reposition, KVRotate::Hadamard, KeyAxis::Token},
      {KVStorage::Int8, KVStorage::Int8, 0, 0, 0, RopeMode::Absolute, KVRotate::Hadamard},
      {KVStorage::Int2, KVStorage::Int3, 4, 29, 0, RopeMode::Reposition, KVRotate::Hadamard, KeyAxis::Token},
      {KVStorage::F32, KVStorage::F32, 4, 29, 0, RopeMode::Reposition, KVRotate::Hadamard},
      {KVStorage::F16, KVStorage::Int4, 2, 40, 0, RopeMode::Absolute, KVRotate::Hadamard},
  };
  std::mt19937 rng(5);
  const ops::SimdLevel saved = ops::simd_level();
  std::vector<ops::SimdLevel> levels{ops::SimdLevel::Scalar};
  if (ops::best_simd_level() != ops::SimdLevel::Scalar) levels.push_back(ops::SimdLevel::Avx2);
  if (ops::best_simd_level() == ops::SimdLevel::Avx512) levels.push_back(ops::SimdLevel::Avx512);
  for (const ops::SimdLevel level : levels)
  for (const int64_t head_dim : {16, 32, 64})
  for (const Case& c : cases) {
    ops::set_simd_level(level);
    KVCacheShape s;
    s.n_layers = 1;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = head_dim;
    s.capacity = 120;
    s.sliding_window = c.model_window;
    CacheSpec o;
    o.key_storage = c.k;
    o.value_storage = c.v;
    o.sink = c.sink;
    o.window = c.window;
    o.rope_mode = c.rm;
    o.kivi_group = 8;
    o.kivi_residual = 8;
    o.rotate = c.rot;
    o.k_axis = c.axis;
    auto cache = make_cache(s, o);
    auto& sc = dynamic_cast<StorageKVCache&>(*cache);
    const int64_t row = s.n_kv_heads * s.head_dim, qrow = s.n_heads * s.head_dim;
    // A prompt chunk first (causal within the chunk), then single tokens.
    int64_t p = 0;
    while (p < 110) {
      const int64_t n = p == 0 ? std::min<int64_t>(20, cache->room()) : 1;
      auto k = randn(size_t(n * row), rng), v = randn(size_t(n * row), rng), q = randn(size_t(n * qrow), rng);
      cache->append(0, k.data(), v.data(), n);
      std::vector<float> out(q.size());
      cache->attend(0, q.data(), n, out.data());
      cache->advance(n);
      p += n;
      if (n > 1) continue;  // the reference below covers the newest query only
      std::vector<float> ref(static_cast<size_t>(qrow));
      reference_attend(sc, 0, q.data(), c.rm, c.model_window, ref.data());
      float mx = 0;
      for (float x : ref) mx = std::max(mx, std::fabs(x));
      // Rotated caches: the reference works in the unrotated basis (M^T applied
      // to every key and value read back), two more fp32 round trips: 3e-5.
      const float tol = c.rot == KVRotate::Hadamard ? 3e-5f : 1e-5f;
      for (int64_t i = 0; i < qrow; ++i)
        ASSERT_NEAR(out[size_t(i)], ref[size_t(i)], tol * mx)
            << o.label() << " " << rope_mode_name(c.rm) << " step " << p
            << " head_dim " << head_dim << " simd " << ops::simd_level_name(level);
    }
  }
  ops::set_simd_level(saved);
}

// The randomised Hadamard rotation is orthogonal (M^T M = I within fp32
// rounding), inverse undoes forward, its signs are fixed by the seed and not
// all equal, and sizes that are not powers of two are refused.
TEST(Rotation, HadamardIsOrthogonalAndSeeded) {
  for (int64_t n : {1, 2, 8, 32, 64, 128, 256}) {
    const HadamardRotation m(n, 7);
    std::vector<float> M(size_t(n * n));  // column j = M e_j
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> e(size_t(n), 0.f);
      e[size_t(j)] = 1.f;
      m.forward(e.data());
      for (int64_t i = 0; i < n; ++i) M[size_t(i * n + j)] = e[size_t(i)];
    }
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = 0; b < n; ++b) {
        double d = 0;
        for (int64_t i = 0; i < n; ++i) d += double(M[size_t(i * n + a)]) * M[size_t(i * n + b)];
        ASSERT_NEAR(d, a == b ? 1.0 : 0.0, 1e-6) << n << " " << a << " " << b;
      }
    std::mt19937 rng{uint32_t(n)};
    auto x = randn(size_t(n), rng), y = x;
    m.forward(y.data());
    m.inverse(y.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5f);
    EXPECT_EQ(HadamardRotation(n, 7).signs(), m.signs());
  }
  const std::vector<float> s = HadamardRotation(64, 7).signs();
  EXPECT_NE(std::count(s.begin(), s.end(), 1.f), 0);
  EXPECT_NE(std::count(s.begin(), s.end(), -1.f), 0);
  EXPECT_NE(HadamardRotation(64, 8).signs(), s);
  EXPECT_THROW(HadamardRotation(24, 1), Error);
  // A cache with head_dim 24 names the field.
  KVCacheShape sh;
  sh.n_layers = 1;
  sh.n_heads = sh.n_kv_heads = 1;
  sh.head_dim = 24;
  sh.capacity = 8;
  CacheSpec o;
  o.rotate = KVRotate::Hadamard;
  try {
    make_cache(sh, o);
    FAIL() << "expected CacheSpecError";
  } catch (const CacheSpecError& e) {
    EXPECT_EQ(e.issue().field, "rotate");
    EXPECT_NE(std::string(e.what()).find("head_dim 24"), std::string::npos) << e.what();
  }
}

// rotate hadamard with fp32 storage gives the attention of rotate none within
// 1e-5 relative (scores are unchanged in exact arithmetic): both RoPE modes,
// StreamingLLM eviction, a model sliding window, prompt chunks and decoding.
TEST(Rotation, Fp32RotatedEqualsUnrotated) {
  struct Case {
    int64_t sink, window, model_window;
    RopeMode rm;
  };
  for (const Case c : {Case{0, 0, 0, RopeMode::Reposition}, Case{4, 29, 0, RopeMode::Reposition},
                       Case{4, 29, 0, RopeMode::Absolute}, Case{0, 0, 23, RopeMode::Reposition}}) {
    KVCacheShape s;
    s.n_layers = 2;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 32;
    s.capacity = 120;
    s.sliding_window = c.model_window;
    CacheSpec o;
    o.sink = c.sink;
    o.window = c.window;
    o.rope_mode = c.rm;
    CacheSpec r = o;
    r.rotate = KVRotate::Hadamard;
    auto a = make_cache(s, o), b = make_cache(s, r);
    std::mt19937 rng(11);
    const int64_t row = s.n_kv_heads * s.head_dim, qrow = s.n_heads * s.head_dim;
    int64_t p = 0;
    while (p < 110) {
      const int64_t n = p == 0 ? std::min<int64_t>(20, a->room()) : 1;
      auto k = randn(size_t(n * row), rng), v = randn(size_t(n * row), rng), q = randn(size_t(n * qrow), rng);
      for (int64_t l = 0; l < s.n_layers; ++l) {
        std::vector<float> oa(q.size()), ob(q.size());
        a->append(l, k.data(), v.data(), n);
        b->append(l, k.data(), v.data(), n);
        a->attend(l, q.data(), n, oa.data());
        b->attend(l, q.data(), n, ob.data());
        float mx = 0;
        for (float x : oa) mx = std::max(mx, std::fabs(x));
        for (size_t i = 0; i < oa.size(); ++i) ASSERT_NEAR(ob[i], oa[i], 1e-5f * mx) << o.label() << " step " << p;
      }
      a->advance(n);
      b->advance(n);
      p += n;
    }
  }
}

// Asymmetric settings: K int4 grouped per channel, V int2 per token, bytes as
// the formula says; describe() names both.
TEST(GroupedKivi, AsymmetricKeyValueSettings) {
  KVCacheShape s;
  s.n_layers = 1;
  s.n_heads = 2;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.capacity = 200;
  CacheSpec o;
  o.storage = KVStorage::Int8;
  o.key_storage = KVStorage::Int4;
  o.value_storage = KVStorage::Int2;
  const std::string d = o.describe();
  EXPECT_NE(d.find("K int4"), std::string::npos) << d;
  EXPECT_NE(d.find("V int2"), std::string::npos) << d;
  auto cache = make_cache(s, o);
  std::mt19937 rng(6);
  const int64_t T = 200;  // default G 32 / R 128: residual 136, 64 quantised (2 groups)
  auto k = randn(size_t(T * 2 * 32), rng), v = randn(k.size(), rng);
  cache->append(0, k.data(), v.data(), T);
  const int64_t r = 128 + (T - 128) % 32, Q = T - r;
  // Residual rows in the default fp16: 2 bytes per element, K and V.
  EXPECT_EQ(cache->payload_bytes(), size_t(2 * (r * 32 * 2 * 2 + Q * 16 + Q * 8)));
  EXPECT_EQ(cache->scale_bytes(), size_t(2 * ((Q / 32) * 32 * 4 + Q * 4)));
  // Only the overridden side changes: K fp16 + V from --kv-quantize int8.
  CacheSpec o2;
  o2.storage = KVStorage::Int8;
  o2.key_storage = KVStorage::F16;
  EXPECT_EQ(o2.k_storage(), KVStorage::F16);
  EXPECT_EQ(o2.v_storage(), KVStorage::Int8);
}

// fp16 / bf16 residual and sinks: each residual/sink row reads back as exactly
// the fp16 (bf16) rounding of what was appended; quantised rows are those of
// an fp32-residual store fed the same rounded values (the group is quantised
// from the stored half-precision rows).
TEST(GroupedKivi, ResidualDtypeRoundsResidualAndSinksOnly) {
  std::mt19937 rng(9);
  const int64_t H = 2, D = 16, cap = 120, sink = 3, G = 8, R = 16, T = 100;
  auto x = randn(size_t(T * H * D), rng);
  for (DType dt : {DType::F16, DType::BF16}) {
    std::vector<float> xr(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      xr[i] = dt == DType::F16 ? f16_to_f32(f32_to_f16(x[i])) : bf16_to_f32(f32_to_bf16(x[i]));
    for (Axis ax : {Axis::PerChannel, Axis::PerToken}) {
      GroupedKiviStore half(ax, kivi::kInt4Range, H, cap, D, sink, G, R, dt);
      GroupedKiviStore full(ax, kivi::kInt4Range, H, cap, D, sink, G, R, DType::F32);
      half.append(x.data(), T);
      full.append(xr.data(), T);
      EXPECT_EQ(half.payload_bytes() + (half.n_sink() + half.n_resid()) * H * D * 2, full.payload_bytes());
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> a(size_t(T * D)), b(a.size());
        half.read(h, a.data());
        full.read(h, b.data());
        EXPECT_EQ(a, b) << "head " << h;
        // Sinks and residual are the rounded input.
        for (int64_t t = 0; t < T; ++t) {
          if (t >= sink && t < sink + half.n_quant()) continue;
          for (int64_t c = 0; c < D; ++c) ASSERT_EQ(a[size_t(t * D + c)], xr[size_t((t * H + h) * D + c)]);
        }
      }
    }
  }
}

// NaN trap: values past fp16's range are saturated when stored (fp16 inf would
// make q.k and p.v inf/NaN); the attention output stays finite.
TEST(GroupedKivi, ResidualDtypeFp16SaturatesInsteadOfInf) {
  KVCacheShape s;
  s.n_layers = 1;
  s.n_heads = 1;
  s.n_kv_heads = 1;
  s.head_dim = 8;
  s.capacity = 64;
  CacheSpec o;
  o.storage = KVStorage::Int4;
  o.kivi_group = 4;
  o.kivi_residual = 4;
  o.residual_dtype = KVStorage::F16;
  auto cache = make_cache(s, o);
  std::vector<float> k(8 * 10, 1e6f), v(8 * 10, -1e6f), q(8, 1e-3f), out(8);
  for (int64_t t = 0; t < 10; ++t) {
    cache->append(0, k.data() + t * 8, v.data() + t * 8, 1);
    cache->attend(0, q.data(), 1, out.data());
    cache->advance(1);
    for (float y : out) ASSERT_TRUE(std::isfinite(y)) << "step " << t;
  }
  const auto rk = dynamic_cast<StorageKVCache&>(*cache).read_keys(0, 0);
  EXPECT_EQ(rk.back(), 65504.f);
}

// The grouped store rejects evictions that do not start after the sinks
// (a middle slice would break the group layout) with an error, not UB.
TEST(GroupedKivi, BadEvictionIsAnError) {
  GroupedKiviStore st(Axis::PerChannel, kivi::kInt4Range, 1, 50, 8, 2, 4, 4);
  std::vector<float> x(50 * 8, 1.f);
  st.append(x.data(), 20);
  EXPECT_THROW(st.evict(5, 8), Error);
  EXPECT_THROW(GroupedKiviStore(Axis::PerToken, kivi::kInt4Range, 1, 50, 8, 0, 8, 12), Error);
}

}  // namespace
}  // namespace ptllm
