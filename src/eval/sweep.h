// Several cache settings in one run: the cache flags of `perplexity` and
// `compare` take comma lists, expanded here into CacheSpec.
#pragma once
#include <string>
#include <vector>

#include "kv/cache_spec.h"

namespace ptllm::eval {

// Raw flag values, each a comma-separated list ("" = the field's default).
struct SweepFlags {
  std::string kv_quantize;    // --kv-quantize fp32,int8,int4
  std::string sink;           // --streaming-llm-sink 0,4,4
  std::string window;         // --streaming-llm-window 256,252,508
  std::string rope;           // --streaming-llm-rope absolute,reposition
  std::string kv_quantize_k;  // --kv-quantize-k int8,int4    (paired with --kv-quantize-v)
  std::string kv_quantize_v;  // --kv-quantize-v int4,int2
  std::string kivi_group;     // --kivi-group 0,32             (paired with --kivi-residual)
  std::string kivi_residual;  // --kivi-residual 128,128
  // Crossed text fields, each entry parsed by CacheSpec::set ("" = the default):
  std::string rotate;          // --kv-rotate none,hadamard
  std::string k_axis;          // --kivi-k-axis channel,token
  std::string residual_dtype;  // --kivi-residual-dtype fp16,fp32
};

// How the lists combine (also in the --help footer of both commands):
// two-part settings are *paired* — sink with window, --kv-quantize-k with
// --kv-quantize-v, --kivi-group with --kivi-residual: lists of equal length are
// zipped and a single value is repeated to the other's length — and everything
// else is *crossed*. Settings come in this order: for each (sink, window) pair
// ("0,0" = the unbounded cache), for each RoPE mode (only the default for an
// unbounded cache, where it makes no difference), for each (group, residual)
// pair, for each (K, V) pair, for each residual dtype, rotation and K axis, for
// each --kv-quantize storage. A K or V entry
// overrides --kv-quantize for that half. KIVI group/residual only matter when
// K or V is quantised (int8/int4/int2) and the residual only when the group is
// > 0: irrelevant values are reset to the defaults. Settings that build the
// same cache are dropped (first one kept); each setting comes back canonical
// (CacheSpec::canonical). Throws CacheSpecError naming the field on a bad value
// or mismatched lengths; each setting is checked (CacheSpec::check, so the
// residual must be a multiple of the group).
std::vector<CacheSpec> expand_sweep(const SweepFlags& f);

// Splits "a, b,c" into {"a","b","c"}; an empty string gives {}.
std::vector<std::string> split_list(const std::string& s);

}  // namespace ptllm::eval
