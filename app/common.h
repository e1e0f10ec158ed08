// Helpers shared by CLI commands.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ptllm::cli {

// Parses "1,2,3" into ids; throws Error naming `flag` on bad input.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& flag);
// Adds --threads to a command; apply_threads() sets the kernel thread count.
void add_threads_flag(CLI::App* cmd, int& threads);
void apply_threads(int threads);

}  // namespace ptllm::cli
