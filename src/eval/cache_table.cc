#include "eval/cache_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kv/quant.h"
#include "kv/rotation.h"

namespace ptllm::eval {

CacheBytes measure_cache_bytes(const Model& model, const CacheSpec& spec, int64_t T) {
  auto cache = make_cache(model.cache_shape(T), spec);
  const auto& s = cache->shape();
  // [T, n_kv_heads, head_dim] of pseudo-random K, and V = -K/2.
  std::vector<float> k(size_t(T * s.n_kv_heads * s.head_dim)), v(k.size());
  uint32_t x = 12345;
  for (size_t i = 0; i < k.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    k[i] = float(int(x >> 16) % 2001 - 1000) / 250.f;
    v[i] = -0.5f * k[i];
  }
  for (int64_t l = 0; l < s.n_layers; ++l) cache->append(l, k.data(), v.data(), T);
  cache->advance(T);
  return {cache->payload_bytes(), cache->scale_bytes()};
}

CacheTable cache_table(const Model& model, const CacheSpec& base, const std::vector<int64_t>& lengths) {
  base.check();
  CacheTable t;
  for (int64_t T : lengths)
    if (T < 1) fail("cache table: length {} (expected token counts >= 1)", T);
  for (KVStorage s : kAllStorages) {
    CacheSpec c = base;
    c.storage = s;
    c = c.canonical();
    if (std::find(t.columns.begin(), t.columns.end(), c) == t.columns.end()) t.columns.push_back(c);
  }
  t.lengths = lengths;
  for (int64_t T : lengths) {
    t.cells.emplace_back();
    for (const CacheSpec& c : t.columns) t.cells.back().push_back(measure_cache_bytes(model, c, T));
  }
  return t;
}

namespace {

kivi::QuantRange range_of(KVStorage s) {
  return s == KVStorage::Int8   ? kivi::kInt8Range
         : s == KVStorage::Int4 ? kivi::kInt4Range
         : s == KVStorage::Int3 ? kivi::kInt3Range
                                : kivi::kInt2Range;
}

// One side (K or V) of one layer and KV head: {payload, scales}.
CacheBytes side_bytes(KVStorage st, bool key, const CacheSpec& o, int64_t D, int64_t T, bool steady) {
  if (!is_quantised(st)) return {size_t(T * D) * (st == KVStorage::F32 ? 4 : 2), 0};
  const size_t row = kivi::row_bytes(D, range_of(st));
  if (o.kivi_group == 0)  // simple scheme: K per channel over all tokens, V per token
    return {size_t(T) * row, key ? (T > 0 ? size_t(D) * 4 : 0) : size_t(T) * 4};
  const int64_t G = o.kivi_group, R = o.kivi_residual;
  const int64_t ns = std::min(o.streaming() ? o.sink : 0, T), m = T - ns;
  const int64_t r = steady ? std::min(m, R + G - 1) : (m < R + G ? m : R + (m - R) % G);
  const int64_t Q = m - r;
  const size_t e = o.residual_dtype == KVStorage::F32 ? 4 : 2;
  const bool per_channel = key && o.k_axis == KeyAxis::Channel;
  const int64_t groups = steady ? (Q > 0 ? (Q + G - 1) / G + 1 : 0) : Q / G;
  return {size_t((ns + r) * D) * e + size_t(Q) * row, per_channel ? size_t(groups * D) * 4 : size_t(Q) * 4};
}

}  // namespace

CacheBytes predicted_cache_bytes(const KVCacheShape& shape, const CacheSpec& spec, int64_t T, bool steady) {
  const CacheSpec o = spec.canonical();
  const CacheBytes k = side_bytes(o.k_storage(), true, o, shape.head_dim, T, steady);
  const CacheBytes v = side_bytes(o.v_storage(), false, o, shape.head_dim, T, steady);
  const size_t lh = size_t(shape.n_layers * shape.n_kv_heads);
  return {lh * (k.payload + v.payload), lh * (k.scales + v.scales)};
}

size_t parse_byte_size(const std::string& text, const std::string& flag) {
  const auto bad = [&]() -> size_t {
    fail("{} {}: expected a byte count >= 1, e.g. 67108864, 64MiB, 1.5GiB or 500MB", flag, text);
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  double num = 0;
  try {
    size_t used = 0;
    num = std::stod(text.substr(0, i), &used);
    if (used != i) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  std::string unit = text.substr(i);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  double mul = 0;
  for (auto [u, f] : std::initializer_list<std::pair<const char*, double>>{
           {"", 1},          {"B", 1},           {"K", 1024},        {"KiB", 1024},    {"KB", 1e3},
           {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},        {"G", 1073741824.0},
           {"GiB", 1073741824.0}, {"GB", 1e9}})
    if (unit == u) mul = f;
  if (mul == 0 || !std::isfinite(num)) return bad();
  const double b = std::floor(num * mul);
  if (b < 1 || b > 1e18) return bad();
  return size_t(b);
}

std::vector<CacheSpec> plan_candidates(const KVCacheShape& shape, int64_t length, int64_t max_unbounded) {
  std::vector<std::pair<int64_t, int64_t>> bounds;  // (sink, window); (0, 0) = unbounded
  if (length <= max_unbounded) bounds.push_back({0, 0});
  for (int64_t w = 256; w - 4 + 4 < length; w *= 2) bounds.push_back({4, w - 4});
  const bool can_rotate = HadamardRotation::valid_size(shape.head_dim);
  std::vector<CacheSpec> out;
  for (auto [sink, window] : bounds)
    for (KVStorage st : kAllStorages)
      for (KeyAxis ax : {KeyAxis::Channel, KeyAxis::Token})
        for (KVRotate rot : {KVRotate::None, KVRotate::Hadamard}) {
          if (!is_quantised(st) && (ax == KeyAxis::Token || rot == KVRotate::Hadamard)) continue;
          if (rot == KVRotate::Hadamard && !can_rotate) continue;
          CacheSpec c;
          c.storage = st;
          c.sink = sink;
          c.window = window;
          c.k_axis = ax;
          c.rotate = rot;
          out.push_back(c.canonical());
        }
  return out;
}

namespace {
// The quality of `spec` in a perplexity JSON: (metric name, value) of the
// first result whose kv_cache is the same cache.
std::optional<std::pair<std::string, double>> quality_of(const nlohmann::json& q, const CacheSpec& spec) {
  if (!q.contains("results") || !q["results"].is_array()) return std::nullopt;
  for (const auto& r : q["results"]) {
    if (!r.contains("kv_cache") || !r.contains("through_cache")) continue;
    CacheSpec s;
    try {
      s = CacheSpec::from_json(r["kv_cache"]);
    } catch (const CacheSpecError&) {
      continue;  // a setting this build does not know
    }
    if (!(s.canonical() == spec.canonical())) continue;
    const auto& tc = r["through_cache"];
    if (tc.contains("kl_divergence") && tc["kl_divergence"].is_object() && tc["kl_divergence"].contains("mean") &&
        tc["kl_divergence"]["mean"].is_number())
      return std::pair{std::string("kl_divergence.mean"), tc["kl_divergence"]["mean"].get<double>()};
    if (tc.contains("ppl") && tc["ppl"].is_number()) return std::pair{std::string("ppl"), tc["ppl"].get<double>()};
  }
  return std::nullopt;
}
}  // namespace

Plan plan_cache(const KVCacheShape& shape, size_t budget, int64_t length, int64_t max_unbounded,
                const nlohmann::json* quality) {
  if (length < 1) fail("--length {}: expected a token count >= 1", length);
  if (quality && !(quality->is_object() && quality->contains("results")))
    fail("--quality: expected the JSON of `perplexity --json` (an object with \"results\")");
  Plan plan;
  const auto cands = plan_candidates(shape, length, max_unbounded);
  plan.considered = int64_t(cands.size());
  // KL divergence ranks when any matched result has it, else perplexity.
  std::vector<std::optional<std::pair<std::string, double>>> q(cands.size());
  bool any_kld = false;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (quality) q[i] = quality_of(*quality, cands[i]);
    any_kld = any_kld || (q[i] && q[i]->first == "kl_divergence.mean");
  }
  if (quality) plan.metric = any_kld ? "kl_divergence.mean" : "ppl";
  for (size_t i = 0; i < cands.size(); ++i) {
    const CacheSpec& c = cands[i];
    const bool steady = c.streaming() && length > c.sink + c.window;
    const int64_t stored = c.streaming() ? std::min(length, c.sink + c.window) : length;
    PlanRow row{c, stored, predicted_cache_bytes(shape, c, stored, steady), std::nullopt};
    if (row.bytes.total() > budget) continue;
    if (q[i] && q[i]->first == plan.metric) row.quality = q[i]->second;
    plan.rows.push_back(row);
  }
  std::stable_sort(plan.rows.begin(), plan.rows.end(), [](const PlanRow& a, const PlanRow& b) {
    if (a.quality && b.quality) return *a.quality < *b.quality;
    if (a.quality || b.quality) return bool(a.quality);
    return a.bytes.total() > b.bytes.total();
  });
  return plan;
}

}  // namespace ptllm::eval
