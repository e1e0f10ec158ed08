#include "eval/sweep.h"

#include <algorithm>
#include <charconv>

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

bool same(const CacheOptions& a, const CacheOptions& b) {
  return a.storage == b.storage && a.sink == b.sink && a.window == b.window &&
         (a.window == 0 || a.rope_mode == b.rope_mode);
}

}  // namespace

std::string short_label(const CacheOptions& o) {
  std::string s(storage_name(o.storage));
  if (o.window > 0) {
    s += o.sink > 0 ? fmt::format(" · sink {} + window {}", o.sink, o.window) : fmt::format(" · window {}", o.window);
    s += fmt::format(" · {}", rope_mode_name(o.rope_mode));
  }
  return s;
}

std::vector<CacheOptions> expand_sweep(const SweepFlags& f) {
  std::vector<KVStorage> storages;
  for (const auto& s : split_list(f.kv_quantize)) {
    if (s.empty()) fail("--kv-quantize \"{}\": empty entry in the list", f.kv_quantize);
    storages.push_back(parse_storage(s));
  }
  if (storages.empty()) storages.push_back(CacheOptions{}.storage);
  std::vector<RopeMode> ropes;
  for (const auto& s : split_list(f.rope)) {
    if (s.empty()) fail("--streaming-llm-rope \"{}\": empty entry in the list", f.rope);
    ropes.push_back(parse_rope_mode(s));
  }
  if (ropes.empty()) ropes.push_back(CacheOptions{}.rope_mode);
  std::vector<int64_t> sinks = int_list(f.sink, "--streaming-llm-sink");
  std::vector<int64_t> windows = int_list(f.window, "--streaming-llm-window");
  if (sinks.empty()) sinks.push_back(0);
  if (windows.empty()) windows.push_back(0);
  const size_t n = std::max(sinks.size(), windows.size());
  if ((sinks.size() != n && sinks.size() != 1) || (windows.size() != n && windows.size() != 1))
    fail("--streaming-llm-sink has {} values and --streaming-llm-window {}: expected equal lengths (they are "
         "paired) or a single value",
         sinks.size(), windows.size());
  std::vector<CacheOptions> out;
  for (size_t i = 0; i < n; ++i) {
    const int64_t sink = sinks[sinks.size() == 1 ? 0 : i], window = windows[windows.size() == 1 ? 0 : i];
    for (RopeMode r : ropes) {
      for (KVStorage st : storages) {
        CacheOptions o;
        o.storage = st;
        o.sink = sink;
        o.window = window;
        o.rope_mode = window > 0 ? r : CacheOptions{}.rope_mode;
        validate(o);
        if (std::none_of(out.begin(), out.end(), [&](const CacheOptions& x) { return same(x, o); })) out.push_back(o);
      }
    }
  }
  return out;
}

}  // namespace ptllm::eval
