// `cache-table`: KV cache bytes per storage mode and length, measured from
// real cache objects (each filled with T tokens of deterministic K/V and asked
// for its byte count). The closed-form formula is in docs/CACHE.md; tests/kv
// checks that the two agree.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/cache_spec.h"
#include "model/model.h"

namespace ptllm::eval {

struct CacheBytes {
  size_t payload = 0, scales = 0;
  size_t total() const { return payload + scales; }
};

// Bytes of a cache of `spec` holding T tokens of `model`'s shape.
CacheBytes measure_cache_bytes(const Model& model, const CacheSpec& spec, int64_t T);

struct CacheTable {
  std::vector<CacheSpec> columns;            // one per storage mode, same cache once
  std::vector<int64_t> lengths;              // rows
  std::vector<std::vector<CacheBytes>> cells;  // [lengths][columns]
};

// Columns: `base` with --kv-quantize set to each storage in turn (its K/V
// overrides and KIVI fields kept), canonical, duplicates dropped.
CacheTable cache_table(const Model& model, const CacheSpec& base, const std::vector<int64_t>& lengths);

}  // namespace ptllm::eval
