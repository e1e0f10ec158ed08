// Several cache settings in one run: the cache flags of `perplexity` and
// `compare` take comma lists, expanded here into CacheOptions.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/cache_options.h"

namespace ptllm::eval {

// Raw flag values, each a comma-separated list ("" = the flag's default).
struct SweepFlags {
  std::string kv_quantize;    // --kv-quantize fp32,int8,int4
  std::string sink;           // --streaming-llm-sink 0,4,4
  std::string window;         // --streaming-llm-window 256,252,508
  std::string rope;           // --streaming-llm-rope absolute,reposition
  std::string kv_quantize_k;  // --kv-quantize-k int8,int4    (paired with --kv-quantize-v)
  std::string kv_quantize_v;  // --kv-quantize-v int4,int2
  std::string kivi_group;     // --kivi-group 0,32             (paired with --kivi-residual)
  std::string kivi_residual;  // --kivi-residual 128,128
};

// How the lists combine (also in the --help footer of both commands):
// two-part settings are *paired* — sink with window, --kv-quantize-k with
// --kv-quantize-v, --kivi-group with --kivi-residual: lists of equal length are
// zipped and a single value is repeated to the other's length — and everything
// else is *crossed*. Settings come in this order: for each (sink, window) pair
// ("0,0" = the unbounded cache), for each RoPE mode (only the default for an
// unbounded cache, where it makes no difference), for each (group, residual)
// pair, for each (K, V) pair, for each --kv-quantize storage. A K or V entry
// overrides --kv-quantize for that half. KIVI group/residual only matter when
// K or V is quantised (int8/int4/int2) and the residual only when the group is
// > 0: irrelevant values are reset to the defaults. Settings that build the
// same cache are dropped (first one kept). Throws Error naming the flag on a
// bad value or mismatched lengths; each setting is checked with validate()
// (so --kivi-residual must be a multiple of --kivi-group).
std::vector<CacheOptions> expand_sweep(const SweepFlags& f);

// Compact storage label: "int8", or "K int4 / V int2" when the halves differ.
std::string storage_label(const CacheOptions& o);

// Short table label: "int8", "int4 simple" (--kivi-group 0), "int4 G16 R64",
// "K int4 / V int2 G32 R128 · sink 4 + window 252 · absolute",
// "fp32 · window 256 · reposition" (describe() gives the long form). The KIVI
// part ("simple" or "G<group> R<residual>") is shown for a quantised K or V when
// the group/residual differ from the defaults (32/128), or always with show_kivi.
std::string short_label(const CacheOptions& o, bool show_kivi = false);

// Labels for a whole sweep: if any quantised setting shows its KIVI part, all
// quantised settings do ("int4 simple" next to "int4 G32 R128", not "int4").
std::vector<std::string> short_labels(const std::vector<CacheOptions>& settings);

// The setting as JSON: setting (describe()), label, kv_quantize, kv_quantize_k,
// kv_quantize_v (effective), kivi_group, kivi_residual (null where they do not
// apply), sink, window, rope ("n/a" for an unbounded cache).
nlohmann::json setting_json(const CacheOptions& o, const std::string& label);

// Splits "a, b,c" into {"a","b","c"}; an empty string gives {}.
std::vector<std::string> split_list(const std::string& s);

}  // namespace ptllm::eval
