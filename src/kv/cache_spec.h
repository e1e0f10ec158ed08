// The one owner of the KV cache settings (issue 13): every command, the sweeps
// and the server describe a cache by a CacheSpec. It parses a field from text,
// validates once (make_cache) with a structured error, and prints itself as a
// label, a one-line description and one JSON object.
//
// Fields and their JSON names (the same names in sample --json, the sweeps,
// bench, cache-table and the server's "kv_cache" object):
//   quantize       K and V storage: fp32 fp16 bf16 int8 int4 int3 int2 (int* = KIVI)
//   quantize_k/_v  override quantize for K / V only
//   sink, window   StreamingLLM: keep the first `sink` and the last `window`
//                  tokens; window 0 = unbounded (everywhere), and then sink must be 0
//   rope           reposition (by slot) or absolute; only a bounded cache uses it
//   kivi_group     KIVI K scales per group of G tokens; 0 = the simple scheme
//   kivi_residual  KIVI newest R tokens in full precision (a multiple of G)
//   residual_dtype grouped KIVI: storage of those residual tokens and the
//                  sinks, fp32 fp16 bf16 (default fp16)
//   rotate         none or hadamard: a fixed seeded orthogonal rotation per KV
//                  head of K (after RoPE), Q and V before storing (rotation.h)
//   k_axis         grouped KIVI keys: channel (per channel in groups, KIVI) or
//                  token (one scale+zero per token, like V)
// to_json adds read-only ones: bounded, label, description.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace ptllm {

enum class KVStorage { F32, F16, BF16, Int8, Int4, Int3, Int2 };
enum class RopeMode { Absolute, Reposition };
enum class KVRotate { None, Hadamard };
enum class KeyAxis { Channel, Token };
inline constexpr KVStorage kAllStorages[] = {KVStorage::F32,  KVStorage::F16,  KVStorage::BF16,
                                              KVStorage::Int8, KVStorage::Int4, KVStorage::Int3,
                                              KVStorage::Int2};
std::string_view storage_name(KVStorage s);  // "fp32", "fp16", "bf16", "int8", "int4", "int3", "int2"
// int8 / int4 / int3 / int2: KIVI codes + fp16 scales (the others are plain casts).
inline bool is_quantised(KVStorage s) {
  return s == KVStorage::Int8 || s == KVStorage::Int4 || s == KVStorage::Int3 || s == KVStorage::Int2;
}
std::string_view rope_mode_name(RopeMode m);

// What is wrong with one field of a spec: the JSON field name, the offending
// value as text, and what was expected. app/ maps `field` to its flag name,
// the server reports it under "kv_cache".
struct SpecIssue {
  std::string field, value, expected;
  std::string related;  // a second field that `expected` names as "{other}", or empty
  // "<name(field)> <value>: expected <expected>", with {other} = name(related).
  std::string message(const std::function<std::string(std::string_view field)>& name) const;
};

// Thrown by CacheSpec::from_json / check() / make_cache. what() is
// message() with fields named "kv_cache.<field>".
class CacheSpecError : public Error {
 public:
  explicit CacheSpecError(SpecIssue issue);
  const SpecIssue& issue() const { return issue_; }

 private:
  SpecIssue issue_;
};

struct CacheSpec {
  KVStorage storage = KVStorage::F32;                   // quantize
  std::optional<KVStorage> key_storage, value_storage;  // quantize_k / quantize_v
  // KIVI (quantised K/V only). kivi_group G > 0: K scales per group of G
  // consecutive tokens and a full-precision residual of the newest tokens
  // (kivi_residual R, a multiple of G), each token quantised once when it leaves
  // the residual; sinks stay full precision. G = 0: the simple scheme (K scales
  // over all stored tokens, re-quantised on append; no residual, R ignored).
  int64_t kivi_group = 32;
  int64_t kivi_residual = 128;
  // Grouped KIVI: the residual and sink rows are stored as this (F32, F16 or
  // BF16) and widened to fp32 for attention. fp16 halves the biggest part of a
  // short int4 cache at no measurable perplexity cost (docs/CACHE.md).
  KVStorage residual_dtype = KVStorage::F16;
  // Randomised Hadamard rotation of K (after RoPE), Q and V per KV head; the
  // attention output is rotated back. Needs head_dim a power of two.
  KVRotate rotate = KVRotate::None;
  // Grouped KIVI keys: per channel in groups of kivi_group (KIVI) or per token.
  KeyAxis k_axis = KeyAxis::Channel;
  int64_t sink = 0;
  int64_t window = 0;  // 0 = unbounded; the window is what bounds the cache
  RopeMode rope_mode = RopeMode::Reposition;

  KVStorage k_storage() const { return key_storage.value_or(storage); }
  KVStorage v_storage() const { return value_storage.value_or(storage); }
  bool quantised() const { return is_quantised(k_storage()) || is_quantised(v_storage()); }
  bool grouped() const { return kivi_group > 0 && quantised(); }
  bool streaming() const { return window > 0; }  // bounded: sink + window slots

  // Whether a writable field's JSON value is a string ("int4") or an integer
  // (252); Unknown for anything else. The server type-checks kv_cache with it.
  enum class FieldKind { Text, Integer, Unknown };
  static FieldKind field_kind(std::string_view field);
  // Sets field `field` (a JSON name above) from text ("int4", "252"); the issue
  // when the field is unknown or the text is no valid value for it.
  std::optional<SpecIssue> set(std::string_view field, std::string_view text);
  // Cross-field rules (sink needs a window, residual a multiple of the group,
  // ranges); the first issue found.
  std::optional<SpecIssue> issue() const;
  void check() const;  // throws CacheSpecError on issue()
  // The same cache with what does not apply reset to its default (RoPE of an
  // unbounded cache, KIVI fields of an unquantised one, the residual of the
  // simple scheme) and K/V stored as quantize (+ quantize_v when V differs), so
  // two specs build the same cache exactly when their canonical forms are ==.
  CacheSpec canonical() const;
  bool operator==(const CacheSpec&) const = default;

  // "int8", or "K int4 / V int2" when the halves differ.
  std::string storage_label() const;
  // Short table label: "int4 simple", "int4 G16 R64", "fp32 · window 256 · reposition".
  // The KIVI part is shown when a quantised K or V has non-default group/residual
  // or with show_kivi.
  std::string label(bool show_kivi = false) const;
  // One line ("kv cache KIVI (K int4 per-channel ...) · StreamingLLM sink 4 + window 252 ...").
  std::string describe() const;
  // Every field (canonical), quantize_k / quantize_v effective, null where a
  // field does not apply (rope of an unbounded cache, kivi_group unless K or V
  // is quantised, kivi_residual unless grouped), plus bounded, label and description.
  nlohmann::json to_json() const;
  // The inverse: any subset of the writable fields (missing or null = default),
  // as strings or integers; an unknown field or bad value throws CacheSpecError.
  // The result is checked and canonical.
  static CacheSpec from_json(const nlohmann::json& j);
};

// Labels for a whole sweep: if any quantised setting shows its KIVI part, all
// quantised settings do ("int4 simple" next to "int4 G32 R128", not "int4").
std::vector<std::string> spec_labels(const std::vector<CacheSpec>& specs);

// Builds a cache for `shape` (shape.capacity = tokens an unbounded cache must
// hold; a StreamingLLM cache gets sink + window slots whatever it says).
// The spec is validated where the cache is made (the StorageKVCache
// constructor): throws CacheSpecError.
std::unique_ptr<KVCache> make_cache(const KVCacheShape& shape, const CacheSpec& spec);

// A backend (src/cuda, `--device cuda`) may take over make_cache: once set,
// make_cache validates the spec as always and then returns factory(shape with
// the StreamingLLM capacity, canonical spec). An empty function restores the CPU cache.
using CacheFactory = std::function<std::unique_ptr<KVCache>(const KVCacheShape&, const CacheSpec&)>;
void set_cache_factory(CacheFactory factory);

}  // namespace ptllm
