#include "eval/sweep.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"

namespace ptllm::eval {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    const auto b = cur.find_first_not_of(" \t"), e = cur.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : cur.substr(b, e - b + 1));
    cur.clear();
  };
  if (s.find_first_not_of(" \t") == std::string::npos) return out;
  for (char c : s) {
    if (c == ',') flush();
    else cur += c;
  }
  flush();
  return out;
}

namespace {

std::vector<int64_t> int_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(s)) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0)
      fail("{} \"{}\": expected a comma-separated list of integers >= 0", flag, s);
    out.push_back(v);
  }
  return out;
}

std::vector<KVStorage> storage_list(const std::string& s, const char* flag) {
  std::vector<KVStorage> out;
  for (const auto& item : split_list(s)) {
    if (item.empty()) fail("{} \"{}\": empty entry in the list", flag, s);
    out.push_back(parse_storage(item, flag));
  }
  return out;
}

// Zips two lists of a paired setting; a single value is repeated to the other's
// length. Both lists must be non-empty.
template <typename A, typename B>
std::vector<std::pair<A, B>> pair_lists(const std::vector<A>& a, const std::vector<B>& b, const char* flag_a,
                                        const char* flag_b) {
  const size_t n = std::max(a.size(), b.size());
  if ((a.size() != n && a.size() != 1) || (b.size() != n && b.size() != 1))
    fail("{} has {} values and {} {}: expected equal lengths (they are paired) or a single value", flag_a, a.size(),
         flag_b, b.size());
  std::vector<std::pair<A, B>> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(a[a.size() == 1 ? 0 : i], b[b.size() == 1 ? 0 : i]);
  return out;
}

bool quantised(const CacheOptions& o) { return is_quantised(o.k_storage()) || is_quantised(o.v_storage()); }

bool default_kivi(const CacheOptions& o) {
  const CacheOptions d;
  return o.kivi_group == d.kivi_group && (o.kivi_group == 0 || o.kivi_residual == d.kivi_residual);
}

// Same cache: effective K/V storage, bound, RoPE (bounded caches only) and the
// KIVI group (quantised only) and residual (grouped only).
bool same(const CacheOptions& a, const CacheOptions& b) {
  if (a.k_storage() != b.k_storage() || a.v_storage() != b.v_storage()) return false;
  if (a.sink != b.sink || a.window != b.window) return false;
  if (a.window != 0 && a.rope_mode != b.rope_mode) return false;
  if (quantised(a)) {
    if (a.kivi_group != b.kivi_group) return false;
    if (a.kivi_group > 0 && a.kivi_residual != b.kivi_residual) return false;
  }
  return true;
}

}  // namespace

std::string storage_label(const CacheOptions& o) {
  const KVStorage k = o.k_storage(), v = o.v_storage();
  if (k == v) return std::string(storage_name(k));
  return fmt::format("K {} / V {}", storage_name(k), storage_name(v));
}

std::string short_label(const CacheOptions& o, bool show_kivi) {
  std::string s = storage_label(o);
  if (quantised(o) && (show_kivi || !default_kivi(o)))
    s += o.kivi_group == 0 ? std::string(" simple") : fmt::format(" G{} R{}", o.kivi_group, o.kivi_residual);
  if (o.window > 0) {
    s += o.sink > 0 ? fmt::format(" · sink {} + window {}", o.sink, o.window) : fmt::format(" · window {}", o.window);
    s += fmt::format(" · {}", rope_mode_name(o.rope_mode));
  }
  return s;
}

std::vector<std::string> short_labels(const std::vector<CacheOptions>& settings) {
  const bool show_kivi = std::any_of(settings.begin(), settings.end(),
                                     [](const CacheOptions& o) { return quantised(o) && !default_kivi(o); });
  std::vector<std::string> out;
  for (const auto& o : settings) out.push_back(short_label(o, show_kivi));
  return out;
}

nlohmann::json setting_json(const CacheOptions& o, const std::string& label) {
  const bool q = quantised(o);
  return {{"setting", describe(o)},
          {"label", label},
          {"kv_quantize", storage_name(o.storage)},
          {"kv_quantize_k", storage_name(o.k_storage())},
          {"kv_quantize_v", storage_name(o.v_storage())},
          {"kivi_group", q ? nlohmann::json(o.kivi_group) : nlohmann::json(nullptr)},
          {"kivi_residual", q && o.kivi_group > 0 ? nlohmann::json(o.kivi_residual) : nlohmann::json(nullptr)},
          {"sink", o.sink},
          {"window", o.window},
          {"rope", o.window > 0 ? std::string(rope_mode_name(o.rope_mode)) : std::string("n/a")}};
}

std::vector<CacheOptions> expand_sweep(const SweepFlags& f) {
  const CacheOptions d;
  std::vector<KVStorage> storages = storage_list(f.kv_quantize, "--kv-quantize");
  if (storages.empty()) storages.push_back(d.storage);
  std::vector<RopeMode> ropes;
  for (const auto& s : split_list(f.rope)) {
    if (s.empty()) fail("--streaming-llm-rope \"{}\": empty entry in the list", f.rope);
    ropes.push_back(parse_rope_mode(s));
  }
  if (ropes.empty()) ropes.push_back(d.rope_mode);
  std::vector<int64_t> sinks = int_list(f.sink, "--streaming-llm-sink");
  std::vector<int64_t> windows = int_list(f.window, "--streaming-llm-window");
  if (sinks.empty()) sinks.push_back(0);
  if (windows.empty()) windows.push_back(0);
  const auto bounds = pair_lists(sinks, windows, "--streaming-llm-sink", "--streaming-llm-window");
  // K/V overrides: absent = follow --kv-quantize.
  std::vector<std::optional<KVStorage>> keys, values;
  for (KVStorage s : storage_list(f.kv_quantize_k, "--kv-quantize-k")) keys.emplace_back(s);
  for (KVStorage s : storage_list(f.kv_quantize_v, "--kv-quantize-v")) values.emplace_back(s);
  if (keys.empty()) keys.emplace_back(std::nullopt);
  if (values.empty()) values.emplace_back(std::nullopt);
  const auto kv = pair_lists(keys, values, "--kv-quantize-k", "--kv-quantize-v");
  std::vector<int64_t> groups = int_list(f.kivi_group, "--kivi-group");
  std::vector<int64_t> residuals = int_list(f.kivi_residual, "--kivi-residual");
  if (groups.empty()) groups.push_back(d.kivi_group);
  if (residuals.empty()) residuals.push_back(d.kivi_residual);
  const auto kivi = pair_lists(groups, residuals, "--kivi-group", "--kivi-residual");

  std::vector<CacheOptions> out;
  for (const auto& [sink, window] : bounds)
    for (RopeMode r : ropes)
      for (const auto& [group, residual] : kivi)
        for (const auto& [key, value] : kv)
          for (KVStorage st : storages) {
            CacheOptions o;
            o.storage = st;
            o.key_storage = key;
            o.value_storage = value;
            o.kivi_group = group;
            o.kivi_residual = residual;
            o.sink = sink;
            o.window = window;
            o.rope_mode = window > 0 ? r : d.rope_mode;
            validate(o);  // names the flag: a sink without a window, a residual not a multiple of the group, ...
            // Reset what makes no difference to this cache, so labels and JSON show only what applies.
            if (!quantised(o)) o.kivi_group = d.kivi_group;
            if (o.kivi_group == 0 || !quantised(o)) o.kivi_residual = d.kivi_residual;
            if (std::none_of(out.begin(), out.end(), [&](const CacheOptions& x) { return same(x, o); }))
              out.push_back(o);
          }
  return out;
}

}  // namespace ptllm::eval
