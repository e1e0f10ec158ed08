// User-facing cache settings (the --streaming-llm-* and --kv-quantize flags)
// and the factory that turns them into a KVCache.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kv/kv_cache.h"

namespace ptllm {

enum class KVStorage { F32, F16, BF16, Int8, Int4 };
enum class RopeMode { Absolute, Reposition };

struct CacheOptions {
  KVStorage storage = KVStorage::F32;
  int64_t sink = 0;    // --streaming-llm-sink
  int64_t window = 0;  // --streaming-llm-window; 0 with sink 0 = unbounded
  RopeMode rope_mode = RopeMode::Reposition;
  bool streaming() const { return window > 0; }
};

// Throws Error naming the flag on invalid combinations.
void validate(const CacheOptions& o);
// One-line description for the banner ("int8 KIVI · StreamingLLM sink 4 + window 252 · reposition").
std::string describe(const CacheOptions& o);

// Builds a cache for `shape` (shape.capacity = tokens an unbounded cache must hold).
std::unique_ptr<KVCache> make_cache(const KVCacheShape& shape, const CacheOptions& o);

}  // namespace ptllm
