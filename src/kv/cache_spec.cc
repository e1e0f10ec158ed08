#include "kv/cache_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "kv/storage_cache.h"

namespace ptllm {

std::string_view storage_name(KVStorage s) {
  switch (s) {
    case KVStorage::F32: return "fp32";
    case KVStorage::F16: return "fp16";
    case KVStorage::BF16: return "bf16";
    case KVStorage::Int8: return "int8";
    case KVStorage::Int4: return "int4";
    case KVStorage::Int3: return "int3";
    case KVStorage::Int2: return "int2";
  }
  return "?";
}

std::string_view rope_mode_name(RopeMode m) { return m == RopeMode::Absolute ? "absolute" : "reposition"; }

std::string SpecIssue::message(const std::function<std::string(std::string_view)>& name) const {
  std::string e = expected;
  if (const size_t at = e.find("{other}"); at != std::string::npos) e.replace(at, 7, name(related));
  return fmt::format("{} {}: expected {}", name(field), value, e);
}

CacheSpecError::CacheSpecError(SpecIssue issue)
    : Error(issue.message([](std::string_view f) { return "kv_cache." + std::string(f); })),
      issue_(std::move(issue)) {}

namespace {

constexpr const char* kStorages = "one of fp32, fp16, bf16, int8, int4, int3, int2";

std::optional<KVStorage> storage_from(std::string_view s) {
  for (KVStorage k : kAllStorages)
    if (s == storage_name(k)) return k;
  return std::nullopt;
}

std::optional<int64_t> int_from(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

SpecIssue issue_of(std::string_view field, std::string_view value, std::string expected) {
  return {std::string(field), std::string(value), std::move(expected), {}};
}

}  // namespace

CacheSpec::FieldKind CacheSpec::field_kind(std::string_view f) {
  for (std::string_view t : {"quantize", "quantize_k", "quantize_v", "rope", "residual_dtype", "rotate", "k_axis"})
    if (f == t) return FieldKind::Text;
  for (std::string_view t : {"sink", "window", "kivi_group", "kivi_residual"})
    if (f == t) return FieldKind::Integer;
  return FieldKind::Unknown;
}

std::optional<SpecIssue> CacheSpec::set(std::string_view field, std::string_view text) {
  if (field == "quantize" || field == "quantize_k" || field == "quantize_v") {
    const auto s = storage_from(text);
    if (!s) return issue_of(field, text, kStorages);
    if (field == "quantize") storage = *s;
    else if (field == "quantize_k") key_storage = *s;
    else value_storage = *s;
    return std::nullopt;
  }
  if (field == "residual_dtype") {
    const auto s = storage_from(text);
    if (!s || is_quantised(*s)) return issue_of(field, text, "one of fp32, fp16, bf16");
    residual_dtype = *s;
    return std::nullopt;
  }
  if (field == "rotate") {
    if (text == "none") rotate = KVRotate::None;
    else if (text == "hadamard") rotate = KVRotate::Hadamard;
    else return issue_of(field, text, "none or hadamard");
    return std::nullopt;
  }
  if (field == "k_axis") {
    if (text == "channel") k_axis = KeyAxis::Channel;
    else if (text == "token") k_axis = KeyAxis::Token;
    else return issue_of(field, text, "channel or token");
    return std::nullopt;
  }
  if (field == "rope") {
    if (text == "absolute") rope_mode = RopeMode::Absolute;
    else if (text == "reposition") rope_mode = RopeMode::Reposition;
    else return issue_of(field, text, "absolute or reposition");
    return std::nullopt;
  }
  int64_t* target = field == "sink"            ? &sink
                    : field == "window"        ? &window
                    : field == "kivi_group"    ? &kivi_group
                    : field == "kivi_residual" ? &kivi_residual
                                               : nullptr;
  if (!target)
    return issue_of(field, "(unknown field)",
                    "one of quantize, quantize_k, quantize_v, sink, window, rope, kivi_group, kivi_residual, "
                    "residual_dtype, rotate, k_axis");
  const auto v = int_from(text);
  if (!v || *v < 0)
    return issue_of(field, text, field == "window" ? "an integer >= 0 (0 = unbounded)" : "an integer >= 0");
  *target = *v;
  return std::nullopt;
}

std::optional<SpecIssue> CacheSpec::issue() const {
  const auto num = [](int64_t v) { return std::to_string(v); };
  if (sink < 0) return issue_of("sink", num(sink), "an integer >= 0");
  if (window < 0) return issue_of("window", num(window), "an integer >= 0 (0 = unbounded)");
  // The window is what bounds the cache: sinks alone would still grow without limit.
  if (sink > 0 && window == 0)
    return SpecIssue{"sink", num(sink), "0 when {other} is 0 (unbounded): the window sets the cache bound", "window"};
  if (kivi_group < 0) return issue_of("kivi_group", num(kivi_group), "an integer >= 0 (0 = the simple scheme)");
  if (kivi_group > 4096) return issue_of("kivi_group", num(kivi_group), "<= 4096");
  if (is_quantised(residual_dtype))
    return issue_of("residual_dtype", std::string(storage_name(residual_dtype)), "one of fp32, fp16, bf16");
  if (kivi_residual < 0) return issue_of("kivi_residual", num(kivi_residual), "an integer >= 0");
  if (kivi_group > 0 && kivi_residual % kivi_group != 0)
    return SpecIssue{"kivi_residual", num(kivi_residual), fmt::format("a multiple of {{other}} {}", kivi_group),
                     "kivi_group"};
  return std::nullopt;
}

void CacheSpec::check() const {
  if (auto i = issue()) throw CacheSpecError(std::move(*i));
}

CacheSpec CacheSpec::canonical() const {
  const CacheSpec d;
  CacheSpec c = *this;
  c.storage = k_storage();
  c.key_storage.reset();
  c.value_storage.reset();
  if (v_storage() != c.storage) c.value_storage = v_storage();
  if (!c.streaming()) c.rope_mode = d.rope_mode;
  if (!c.quantised()) c.kivi_group = d.kivi_group;
  if (!c.grouped()) {
    c.kivi_residual = d.kivi_residual;
    c.residual_dtype = d.residual_dtype;
  }
  // Only grouped quantised keys have an axis to choose.
  if (!(c.grouped() && is_quantised(c.k_storage()))) c.k_axis = d.k_axis;
  return c;
}

std::string CacheSpec::storage_label() const {
  const KVStorage k = k_storage(), v = v_storage();
  if (k == v) return std::string(storage_name(k));
  return fmt::format("K {} / V {}", storage_name(k), storage_name(v));
}

namespace {
// Group/residual/residual dtype at their defaults (32/128/fp16; residual and
// its dtype do not count for the simple scheme).
bool default_kivi(const CacheSpec& o) {
  const CacheSpec d;
  return o.kivi_group == d.kivi_group &&
         (o.kivi_group == 0 || (o.kivi_residual == d.kivi_residual && o.residual_dtype == d.residual_dtype));
}
}  // namespace

std::string CacheSpec::label(bool show_kivi) const {
  std::string s = storage_label();
  if (quantised() && (show_kivi || !default_kivi(*this)))
    s += kivi_group == 0 ? std::string(" simple") : fmt::format(" G{} R{}", kivi_group, kivi_residual);
  // The residual's storage only when it is not the default (fp16).
  if (grouped() && residual_dtype != CacheSpec{}.residual_dtype)
    s += fmt::format(" res {}", storage_name(residual_dtype));
  if (grouped() && is_quantised(k_storage()) && k_axis == KeyAxis::Token) s += " K per-token";
  if (rotate == KVRotate::Hadamard) s += " hadamard";
  if (streaming()) {
    s += sink > 0 ? fmt::format(" · sink {} + window {}", sink, window) : fmt::format(" · window {}", window);
    s += fmt::format(" · {}", rope_mode_name(rope_mode));
  }
  return s;
}

std::vector<std::string> spec_labels(const std::vector<CacheSpec>& specs) {
  const bool show_kivi = std::any_of(specs.begin(), specs.end(),
                                     [](const CacheSpec& s) { return s.quantised() && !default_kivi(s); });
  std::vector<std::string> out;
  for (const auto& s : specs) out.push_back(s.label(show_kivi));
  return out;
}

namespace {
std::string kivi_part(KVStorage st, bool key, const CacheSpec& o) {
  if (!is_quantised(st)) return std::string(storage_name(st));
  const bool per_channel = key && !(o.kivi_group > 0 && o.k_axis == KeyAxis::Token);
  std::string s = fmt::format("{} {}", storage_name(st), per_channel ? "per-channel" : "per-token");
  if (key && o.kivi_group == 0) s += " over all stored tokens (simple scheme)";
  if (per_channel && o.kivi_group > 0) s += fmt::format(" in groups of {}", o.kivi_group);
  return s;
}
}  // namespace

std::string CacheSpec::describe() const {
  const KVStorage ks = k_storage(), vs = v_storage();
  std::string s;
  if (!quantised())
    s = ks == vs ? fmt::format("kv cache {}", storage_name(ks))
                 : fmt::format("kv cache K {} · V {}", storage_name(ks), storage_name(vs));
  else {
    s = fmt::format("kv cache KIVI (K {} · V {}, fp16 scale+zero", kivi_part(ks, true, *this),
                    kivi_part(vs, false, *this));
    if (kivi_group > 0)
      s += fmt::format("; newest {}..{} tokens{} in {}, each token quantised once", kivi_residual,
                       kivi_residual + kivi_group - 1, sink > 0 && streaming() ? " and the sinks" : "",
                       storage_name(residual_dtype));
    s += ")";
  }
  if (rotate == KVRotate::Hadamard) s += " · K, Q, V rotated by a seeded randomised Hadamard per KV head";
  if (streaming())
    s += fmt::format(" · StreamingLLM sink {} + window {} (<= {} tokens per layer) · RoPE {}", sink, window,
                     sink + window, rope_mode_name(rope_mode));
  else
    s += fmt::format(" · unbounded (up to the context length) · RoPE {}", rope_mode_name(rope_mode));
  return s;
}

nlohmann::json CacheSpec::to_json() const {
  const CacheSpec c = canonical();
  const auto or_null = [](bool applies, const nlohmann::json& v) { return applies ? v : nlohmann::json(nullptr); };
  return {{"quantize", storage_name(c.storage)},
          {"quantize_k", storage_name(c.k_storage())},
          {"quantize_v", storage_name(c.v_storage())},
          {"sink", c.sink},
          {"window", c.window},
          {"rope", or_null(c.streaming(), rope_mode_name(c.rope_mode))},
          {"kivi_group", or_null(c.quantised(), c.kivi_group)},
          {"kivi_residual", or_null(c.grouped(), c.kivi_residual)},
          {"residual_dtype", or_null(c.grouped(), storage_name(c.residual_dtype))},
          {"rotate", c.rotate == KVRotate::Hadamard ? "hadamard" : "none"},
          {"k_axis", or_null(c.grouped() && is_quantised(c.k_storage()),
                             c.k_axis == KeyAxis::Token ? "token" : "channel")},
          {"bounded", c.streaming()},
          {"label", c.label()},
          {"description", c.describe()}};
}

CacheSpec CacheSpec::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw CacheSpecError(issue_of("(object)", j.dump(), "a JSON object of cache fields"));
  CacheSpec s;
  for (const auto& [key, value] : j.items()) {
    // Read-only fields that to_json adds are accepted back (so a printed object
    // can be sent again) and ignored, except `bounded`, which must agree.
    if (key == "bounded" || key == "label" || key == "description") continue;
    if (value.is_null()) continue;  // a field that does not apply: its default
    std::string text;
    if (value.is_string()) text = value.get<std::string>();
    else if (value.is_number_integer()) text = std::to_string(value.get<int64_t>());
    else throw CacheSpecError(issue_of(key, value.dump(), "a string or an integer"));
    if (auto i = s.set(key, text)) throw CacheSpecError(std::move(*i));
  }
  s.check();
  if (j.contains("bounded") && (!j["bounded"].is_boolean() || j["bounded"].get<bool>() != s.streaming()))
    throw CacheSpecError(issue_of("bounded", j["bounded"].dump(), fmt::format("{} (window {})", s.streaming(), s.window)));
  return s.canonical();
}

namespace {
CacheFactory& cache_factory() {
  static CacheFactory f;
  return f;
}
}  // namespace

void set_cache_factory(CacheFactory factory) { cache_factory() = std::move(factory); }

std::unique_ptr<KVCache> make_cache(const KVCacheShape& shape, const CacheSpec& spec) {
  KVCacheShape s = shape;
  if (spec.streaming()) s.capacity = spec.sink + spec.window;
  if (cache_factory()) {
    spec.check();
    return cache_factory()(s, spec.canonical());
  }
  // Canonical, so the cache describes itself as every JSON object describes its
  // spec (an unbounded cache's RoPE mode changes nothing: slot = position).
  return std::make_unique<StorageKVCache>(s, spec.issue() ? spec : spec.canonical());
}

}  // namespace ptllm
