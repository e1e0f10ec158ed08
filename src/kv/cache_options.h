// User-facing cache settings (the --streaming-llm-* and --kv-quantize flags)
// and the factory that turns them into a KVCache.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kv/kv_cache.h"

namespace ptllm {

enum class KVStorage { F32, F16, BF16, Int8, Int4 };
enum class RopeMode { Absolute, Reposition };
inline constexpr KVStorage kAllStorages[] = {KVStorage::F32, KVStorage::F16, KVStorage::BF16, KVStorage::Int8,
                                              KVStorage::Int4};
std::string_view storage_name(KVStorage s);  // "fp32", "fp16", "bf16", "int8", "int4"
KVStorage parse_storage(const std::string& s);  // throws Error naming --kv-quantize and the valid values
std::string_view rope_mode_name(RopeMode m);
RopeMode parse_rope_mode(const std::string& s);  // throws Error naming --streaming-llm-rope

struct CacheOptions {
  KVStorage storage = KVStorage::F32;
  int64_t sink = 0;    // --streaming-llm-sink
  // --streaming-llm-window; 0 (with sink 0) = unbounded. The window is what
  // bounds the cache, so a sink without a window is an error (validate()).
  int64_t window = 0;
  RopeMode rope_mode = RopeMode::Reposition;
  bool streaming() const { return window > 0; }
};

// Throws Error naming the flag on invalid combinations.
void validate(const CacheOptions& o);
// One-line description for the banner ("int8 KIVI · StreamingLLM sink 4 + window 252 · reposition").
std::string describe(const CacheOptions& o);

// Builds a cache for `shape` (shape.capacity = tokens an unbounded cache must
// hold; a StreamingLLM cache gets sink + window slots whatever it says).
std::unique_ptr<KVCache> make_cache(const KVCacheShape& shape, const CacheOptions& o);

}  // namespace ptllm
