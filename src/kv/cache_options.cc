#include "kv/cache_options.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kv/storage_cache.h"

namespace ptllm {

std::string_view storage_name(KVStorage s) {
  switch (s) {
    case KVStorage::F32: return "fp32";
    case KVStorage::F16: return "fp16";
    case KVStorage::BF16: return "bf16";
    case KVStorage::Int8: return "int8";
    case KVStorage::Int4: return "int4";
  }
  return "?";
}

KVStorage parse_storage(const std::string& s) {
  for (KVStorage k : kAllStorages)
    if (s == storage_name(k)) return k;
  fail("--kv-quantize {}: expected one of fp32, fp16, bf16, int8, int4", s);
}

std::string_view rope_mode_name(RopeMode m) { return m == RopeMode::Absolute ? "absolute" : "reposition"; }

RopeMode parse_rope_mode(const std::string& s) {
  if (s == "absolute") return RopeMode::Absolute;
  if (s == "reposition") return RopeMode::Reposition;
  fail("--streaming-llm-rope {}: expected absolute or reposition", s);
}

void validate(const CacheOptions& o) {
  if (o.sink < 0) fail("--streaming-llm-sink {}: expected >= 0", o.sink);
  if (o.window < 0) fail("--streaming-llm-window {}: expected >= 1", o.window);
  // The window is what bounds the cache: sinks alone would still grow without limit.
  if (o.sink > 0 && o.window == 0)
    fail("--streaming-llm-sink {} needs --streaming-llm-window M (M >= 1): the window sets the cache bound",
         o.sink);
}

std::string describe(const CacheOptions& o) {
  std::string s = fmt::format("kv cache {}", storage_name(o.storage));
  if (o.storage == KVStorage::Int8 || o.storage == KVStorage::Int4)
    s += fmt::format(" KIVI (K per-channel, V per-token, fp16 scale+zero{})",
                     o.storage == KVStorage::Int4 ? ", 2 codes per byte" : "");
  if (o.streaming())
    s += fmt::format(" · StreamingLLM sink {} + window {} (<= {} tokens per layer) · RoPE {}", o.sink, o.window,
                     o.sink + o.window, rope_mode_name(o.rope_mode));
  else
    s += fmt::format(" · unbounded (up to the context length) · RoPE {}", rope_mode_name(o.rope_mode));
  return s;
}

std::unique_ptr<KVCache> make_cache(const KVCacheShape& shape, const CacheOptions& o) {
  validate(o);
  KVCacheShape s = shape;
  if (o.streaming()) s.capacity = o.sink + o.window;
  return std::make_unique<StorageKVCache>(s, o);
}

}  // namespace ptllm
