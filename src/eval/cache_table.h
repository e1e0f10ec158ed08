// `cache-table`: KV cache bytes per storage mode and length, measured from
// real cache objects (each filled with T tokens of deterministic K/V and asked
// for its byte count). The closed-form formula is in docs/CACHE.md; tests/kv
// checks that the two agree.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

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

// ---- planner: cache-table --budget BYTES --length N ----

// Closed-form bytes of `spec` at `shape` (layers, KV heads, head_dim) holding
// T tokens per layer, filled from empty (equals measure_cache_bytes). With
// `steady` (a bounded cache that has started evicting, T = sink + window) the
// most it holds at any later step: the grouped residual at its largest
// (R + G - 1 tokens) and one more K group (the sliced oldest one).
CacheBytes predicted_cache_bytes(const KVCacheShape& shape, const CacheSpec& spec, int64_t T, bool steady = false);

// "67108864", "64MiB", "64 MiB", "1.5GiB", "500MB" (K/M/G and KiB/MiB/GiB are
// powers of 1024, KB/MB/GB of 1000; a trailing B optional). Throws Error
// "--budget <text>: expected ..." on anything else or a budget < 1 byte.
size_t parse_byte_size(const std::string& text, const std::string& flag = "--budget");

struct PlanRow {
  CacheSpec spec;
  int64_t stored = 0;  // tokens per layer at the length (bounded: sink + window)
  CacheBytes bytes;    // at most this many at any step up to the length
  std::optional<double> quality;  // the metric from the quality file; nullopt = not measured
};
struct Plan {
  std::vector<PlanRow> rows;  // settings that fit, best quality first, then not measured (largest first)
  std::string metric;         // "kl_divergence.mean" or "ppl" (lower is better), "" without a file
  int64_t considered = 0;     // candidate settings before the budget
};

// The candidates for `length` tokens: every storage (fp32 ... int2) and, for
// int8/int4/int3/int2, K per channel or per token, each with and without the
// Hadamard rotation (head_dim a power of two); unbounded (only when length <=
// max_unbounded, the model context) and StreamingLLM sink 4 + window
// 2^k - 4 (252 ... ) below the length.
std::vector<CacheSpec> plan_candidates(const KVCacheShape& shape, int64_t length, int64_t max_unbounded);

// Settings whose bytes fit `budget` at `length` tokens, with their quality
// from `quality` (the JSON of `perplexity --json`: results[].kv_cache and
// results[].through_cache.{kl_divergence.mean | ppl}; null = none). A setting
// matches a result when their canonical CacheSpecs are equal.
Plan plan_cache(const KVCacheShape& shape, size_t budget, int64_t length, int64_t max_unbounded,
                const nlohmann::json* quality);

}  // namespace ptllm::eval
