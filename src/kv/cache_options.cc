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
    case KVStorage::Int2: return "int2";
  }
  return "?";
}

KVStorage parse_storage(const std::string& s, std::string_view flag) {
  for (KVStorage k : kAllStorages)
    if (s == storage_name(k)) return k;
  fail("{} {}: expected one of fp32, fp16, bf16, int8, int4, int2", flag, s);
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
  if (o.kivi_group < 0) fail("--kivi-group {}: expected >= 0 (0 = the simple scheme)", o.kivi_group);
  if (o.kivi_group > 4096) fail("--kivi-group {}: expected <= 4096", o.kivi_group);
  if (o.kivi_residual < 0) fail("--kivi-residual {}: expected >= 0", o.kivi_residual);
  if (o.kivi_group > 0 && o.kivi_residual % o.kivi_group != 0)
    fail("--kivi-residual {}: expected a multiple of --kivi-group {}", o.kivi_residual, o.kivi_group);
}

namespace {
std::string kivi_part(KVStorage st, bool key, const CacheOptions& o) {
  if (!is_quantised(st)) return std::string(storage_name(st));
  std::string s = fmt::format("{} {}", storage_name(st), key ? "per-channel" : "per-token");
  if (key && o.kivi_group == 0) s += " over all stored tokens (simple scheme)";
  if (key && o.kivi_group > 0) s += fmt::format(" in groups of {}", o.kivi_group);
  return s;
}
}  // namespace

std::string describe(const CacheOptions& o) {
  const KVStorage ks = o.k_storage(), vs = o.v_storage();
  std::string s;
  if (!is_quantised(ks) && !is_quantised(vs))
    s = ks == vs ? fmt::format("kv cache {}", storage_name(ks))
                 : fmt::format("kv cache K {} · V {}", storage_name(ks), storage_name(vs));
  else {
    s = fmt::format("kv cache KIVI (K {} · V {}, fp16 scale+zero", kivi_part(ks, true, o), kivi_part(vs, false, o));
    if (o.kivi_group > 0)
      s += fmt::format("; newest {}..{} tokens{} full precision, each token quantised once", o.kivi_residual,
                       o.kivi_residual + o.kivi_group - 1, o.sink > 0 && o.streaming() ? " and the sinks" : "");
    s += ")";
  }
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
