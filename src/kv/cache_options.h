// User-facing cache settings (the --streaming-llm-* and --kv-quantize flags)
// and the factory that turns them into a KVCache.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kv/kv_cache.h"

namespace ptllm {

enum class KVStorage { F32, F16, BF16, Int8, Int4, Int2 };
enum class RopeMode { Absolute, Reposition };
inline constexpr KVStorage kAllStorages[] = {KVStorage::F32,  KVStorage::F16,  KVStorage::BF16,
                                              KVStorage::Int8, KVStorage::Int4, KVStorage::Int2};
std::string_view storage_name(KVStorage s);  // "fp32", "fp16", "bf16", "int8", "int4", "int2"
// Throws Error naming `flag` (--kv-quantize, --kv-quantize-k, ...) and the valid values.
KVStorage parse_storage(const std::string& s, std::string_view flag = "--kv-quantize");
// int8 / int4 / int2: KIVI codes + fp16 scales (the others are plain casts).
inline bool is_quantised(KVStorage s) { return s == KVStorage::Int8 || s == KVStorage::Int4 || s == KVStorage::Int2; }
std::string_view rope_mode_name(RopeMode m);
RopeMode parse_rope_mode(const std::string& s);  // throws Error naming --streaming-llm-rope

struct CacheOptions {
  KVStorage storage = KVStorage::F32;  // --kv-quantize: K and V unless overridden below
  std::optional<KVStorage> key_storage, value_storage;  // --kv-quantize-k / --kv-quantize-v
  // KIVI (quantised K/V only). kivi_group G > 0: K scales per group of G
  // consecutive tokens and a full-precision residual of the newest tokens
  // (kivi_residual R, a multiple of G), each token quantised once when it leaves
  // the residual; sinks stay full precision. G = 0: the simple scheme (K scales
  // over all stored tokens, re-quantised on append; no residual, R ignored).
  int64_t kivi_group = 32;       // --kivi-group
  int64_t kivi_residual = 128;   // --kivi-residual
  KVStorage k_storage() const { return key_storage.value_or(storage); }
  KVStorage v_storage() const { return value_storage.value_or(storage); }
  bool grouped() const { return kivi_group > 0 && (is_quantised(k_storage()) || is_quantised(v_storage())); }
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
