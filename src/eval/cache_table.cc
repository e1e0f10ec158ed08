#include "eval/cache_table.h"

#include <algorithm>

#include "core/error.h"

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

}  // namespace ptllm::eval
