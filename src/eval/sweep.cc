#include "eval/sweep.h"

#include <algorithm>
#include <array>
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

[[noreturn]] void list_error(const char* field, const std::string& list, std::string expected,
                             std::string related = {}) {
  throw CacheSpecError({field, "\"" + list + "\"", std::move(expected), std::move(related)});
}

std::vector<int64_t> int_list(const std::string& s, const char* field) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(s)) {
    CacheSpec probe;
    if (item.empty() || probe.set(field, item)) list_error(field, s, "a comma-separated list of integers >= 0");
    out.push_back(field == std::string_view("sink")     ? probe.sink
                  : field == std::string_view("window") ? probe.window
                  : field == std::string_view("kivi_group") ? probe.kivi_group
                                                            : probe.kivi_residual);
  }
  return out;
}

std::vector<KVStorage> storage_list(const std::string& s, const char* field) {
  std::vector<KVStorage> out;
  for (const auto& item : split_list(s)) {
    if (item.empty()) list_error(field, s, "no empty entry in the list");
    CacheSpec probe;
    if (auto issue = probe.set("quantize", item)) throw CacheSpecError({field, item, issue->expected, {}});
    out.push_back(probe.storage);
  }
  return out;
}

// Zips two lists of a paired setting; a single value is repeated to the other's
// length. Both lists must be non-empty.
template <typename A, typename B>
std::vector<std::pair<A, B>> pair_lists(const std::vector<A>& a, const std::vector<B>& b, const char* field_a,
                                        const char* field_b) {
  const size_t n = std::max(a.size(), b.size());
  if ((a.size() != n && a.size() != 1) || (b.size() != n && b.size() != 1))
    throw CacheSpecError({field_a, fmt::format("has {} values", a.size()),
                          fmt::format("as many as {{other}} ({}) or a single value: they are paired", b.size()),
                          field_b});
  std::vector<std::pair<A, B>> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(a[a.size() == 1 ? 0 : i], b[b.size() == 1 ? 0 : i]);
  return out;
}

template <typename T>
std::vector<T> or_default(std::vector<T> v, T d) {
  if (v.empty()) v.push_back(d);
  return v;
}

// Entries of a crossed text field, each checked by CacheSpec::set; {""} (keep
// the default) when the list is empty.
std::vector<std::string> text_list(const std::string& s, const char* field) {
  std::vector<std::string> out;
  for (const auto& item : split_list(s)) {
    if (item.empty()) list_error(field, s, "no empty entry in the list");
    CacheSpec probe;
    if (auto issue = probe.set(field, item)) throw CacheSpecError(std::move(*issue));
    out.push_back(item);
  }
  if (out.empty()) out.emplace_back();
  return out;
}

}  // namespace

std::vector<CacheSpec> expand_sweep(const SweepFlags& f) {
  const CacheSpec d;
  const auto storages = or_default(storage_list(f.kv_quantize, "quantize"), d.storage);
  std::vector<RopeMode> ropes;
  for (const auto& s : split_list(f.rope)) {
    if (s.empty()) list_error("rope", f.rope, "no empty entry in the list");
    CacheSpec probe;
    if (auto issue = probe.set("rope", s)) throw CacheSpecError(std::move(*issue));
    ropes.push_back(probe.rope_mode);
  }
  if (ropes.empty()) ropes.push_back(d.rope_mode);
  const auto bounds = pair_lists(or_default(int_list(f.sink, "sink"), d.sink),
                                 or_default(int_list(f.window, "window"), d.window), "sink", "window");
  // K/V overrides: absent = follow --kv-quantize.
  std::vector<std::optional<KVStorage>> keys, values;
  for (KVStorage s : storage_list(f.kv_quantize_k, "quantize_k")) keys.emplace_back(s);
  for (KVStorage s : storage_list(f.kv_quantize_v, "quantize_v")) values.emplace_back(s);
  if (keys.empty()) keys.emplace_back(std::nullopt);
  if (values.empty()) values.emplace_back(std::nullopt);
  const auto kv = pair_lists(keys, values, "quantize_k", "quantize_v");
  const auto kivi = pair_lists(or_default(int_list(f.kivi_group, "kivi_group"), d.kivi_group),
                               or_default(int_list(f.kivi_residual, "kivi_residual"), d.kivi_residual), "kivi_group",
                               "kivi_residual");
  const auto residual_dtypes = text_list(f.residual_dtype, "residual_dtype");
  const auto rotates = text_list(f.rotate, "rotate");
  const auto axes = text_list(f.k_axis, "k_axis");
  // (residual dtype, rotation, K axis) crossed, in that order.
  std::vector<std::array<std::string, 3>> variants;
  for (const auto& rd : residual_dtypes)
    for (const auto& rot : rotates)
      for (const auto& ax : axes) variants.push_back({rd, rot, ax});

  std::vector<CacheSpec> out;
  for (const auto& [sink, window] : bounds)
    for (RopeMode r : ropes)
      for (const auto& [group, residual] : kivi)
        for (const auto& [key, value] : kv)
          for (const auto& variant : variants)
          for (KVStorage st : storages) {
            CacheSpec o;
            for (size_t i = 0; i < variant.size(); ++i)
              if (!variant[i].empty()) (void)o.set(std::array{"residual_dtype", "rotate", "k_axis"}[i], variant[i]);
            o.storage = st;
            o.key_storage = key;
            o.value_storage = value;
            o.kivi_group = group;
            o.kivi_residual = residual;
            o.sink = sink;
            o.window = window;
            o.rope_mode = r;
            o.check();  // a sink without a window, a residual not a multiple of the group, ...
            // Canonical: what makes no difference to this cache is reset, so equal caches compare ==.
            o = o.canonical();
            if (std::find(out.begin(), out.end(), o) == out.end()) out.push_back(o);
          }
  return out;
}

}  // namespace ptllm::eval
