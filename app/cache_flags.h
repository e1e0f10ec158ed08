// The KV cache flags shared by every command that decodes (sample, bench,
// ...): --kv-quantize, --kv-quantize-k, --kv-quantize-v, --kivi-group,
// --kivi-residual, --kivi-residual-dtype, --kivi-k-axis, --kv-rotate,
// --streaming-llm-sink, --streaming-llm-window, --streaming-llm-rope. Rules (docs/CACHE.md):
//   * no StreamingLLM flags: unbounded cache (up to the context length);
//   * --streaming-llm-window M (M >= 1) bounds the cache to sink + M tokens;
//     a window without a sink is allowed (sink 0, a plain sliding window);
//   * --streaming-llm-sink without a window is an error: sinks alone are no bound;
//   * --kivi-residual must be a multiple of --kivi-group (group 0 = simple scheme).
// Each flag is one CacheSpec field (cache_flag_name maps the field to the
// flag): the value is parsed once, by CacheSpec::set, while parsing the command
// line; cross-flag rules are checked where the cache is made, and main() prints
// the CacheSpecError with flag names (flag_message).
#pragma once
#include <CLI/CLI.hpp>

#include "eval/sweep.h"
#include "kv/cache_spec.h"

namespace ptllm::cli {

// "--kv-quantize" for "quantize", ... (the field itself when it has no flag).
std::string cache_flag_name(std::string_view field);
// The error as the CLI user sees it: "--kivi-residual 100: expected a multiple of --kivi-group 32".
std::string flag_message(const CacheSpecError& e);

void add_cache_flags(CLI::App* cmd, CacheSpec& o);
// Only --kv-quantize-k, --kv-quantize-v, --kivi-group, --kivi-residual,
// --kivi-residual-dtype, --kivi-k-axis and --kv-rotate (part of
// add_cache_flags; `cache-table` takes just these).
void add_kivi_flags(CLI::App* cmd, CacheSpec& o);

// The same cache flags as comma lists, for the sweeps of `perplexity` and
// `compare` (expanded by eval::expand_sweep, which checks the values); also
// sets the command's --help footer to the rule for combining the lists.
// `kv_quantize_default` is the --kv-quantize default shown in --help.
void add_sweep_flags(CLI::App* cmd, eval::SweepFlags& f, const std::string& kv_quantize_default);

}  // namespace ptllm::cli
