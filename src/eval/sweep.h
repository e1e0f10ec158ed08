// Several cache settings in one run: the cache flags of `perplexity` and
// `compare` take comma lists, expanded here into CacheOptions.
#pragma once
#include <string>
#include <vector>

#include "kv/cache_options.h"

namespace ptllm::eval {

// Raw flag values, each a comma-separated list ("" = the flag's default).
struct SweepFlags {
  std::string kv_quantize;  // --kv-quantize fp32,int8,int4
  std::string sink;         // --streaming-llm-sink 0,4,4
  std::string window;       // --streaming-llm-window 256,252,508
  std::string rope;         // --streaming-llm-rope absolute,reposition
};

// Settings in this order: for each (sink, window) pair — the two lists are
// zipped, a single value is repeated to the other's length, and "0,0" means
// the unbounded cache — for each RoPE mode (only the default for an unbounded
// cache, where it makes no difference), for each storage. Duplicates are
// dropped. Throws Error naming the flag on a bad value or mismatched lengths;
// each setting is checked with validate().
std::vector<CacheOptions> expand_sweep(const SweepFlags& f);

// Short table label: "int8", "int4 · sink 4 + window 252 · absolute",
// "fp32 · window 256 · reposition" (describe() gives the long form).
std::string short_label(const CacheOptions& o);

// Splits "a, b,c" into {"a","b","c"}; an empty string gives {}.
std::vector<std::string> split_list(const std::string& s);

}  // namespace ptllm::eval
