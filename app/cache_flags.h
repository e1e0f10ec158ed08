// The KV cache flags shared by every command that decodes (sample, bench,
// ...): --kv-quantize, --kv-quantize-k, --kv-quantize-v, --kivi-group,
// --kivi-residual, --streaming-llm-sink, --streaming-llm-window,
// --streaming-llm-rope. Rules (docs/CACHE.md):
//   * no StreamingLLM flags: unbounded cache (up to the context length);
//   * --streaming-llm-window M (M >= 1) bounds the cache to sink + M tokens;
//     a window without a sink is allowed (sink 0, a plain sliding window);
//   * --streaming-llm-sink without a window is an error: sinks alone are no bound;
//   * --kivi-residual must be a multiple of --kivi-group (group 0 = simple scheme).
// Single-flag checks run while parsing; the cross-flag rule is checked by
// validate(), which make_cache() also calls.
#pragma once
#include <CLI/CLI.hpp>

#include "kv/cache_options.h"

namespace ptllm::cli {

void add_cache_flags(CLI::App* cmd, CacheOptions& o);

}  // namespace ptllm::cli
