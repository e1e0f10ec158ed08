#include "app/common.h"

#include <charconv>

#include "core/error.h"
#include "ops/ops.h"

namespace ptllm::cli {

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || s[i] == ' ' || s[i] == '[' || s[i] == ']')) ++i;
    if (i >= s.size()) break;
    int32_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
    if (ec != std::errc() || v < 0) fail("{} \"{}\": expected comma-separated non-negative token ids", flag, s);
    ids.push_back(v);
    i = size_t(p - s.data());
  }
  if (ids.empty()) fail("{}: expected at least one token id", flag);
  return ids;
}

void add_threads_flag(CLI::App* cmd, int& threads) {
  cmd->add_option("--threads", threads, "Worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
}

void apply_threads(int threads) { ops::set_num_threads(threads); }

}  // namespace ptllm::cli
