#include "kv/cache_options.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ptllm {

void validate(const CacheOptions& o) {
  if (o.sink < 0) fail("--streaming-llm-sink {}: expected >= 0", o.sink);
  if (o.window < 0) fail("--streaming-llm-window {}: expected >= 1", o.window);
  if (o.storage != KVStorage::F32 || o.window > 0 || o.sink > 0)
    fail("cache settings other than the fp32 unbounded cache are not implemented yet");
}

std::string describe(const CacheOptions& o) { return "fp32"; }

std::unique_ptr<KVCache> make_cache(const KVCacheShape& shape, const CacheOptions& o) {
  validate(o);
  return std::make_unique<Fp32KVCache>(shape);
}

}  // namespace ptllm
