// Each CLI command lives in its own app/cmd_*.cc and registers itself on the
// root CLI11 app. main.cc only calls these.
#pragma once
#include <CLI/CLI.hpp>

namespace ptllm::cli {
void add_sample_command(CLI::App& root);
void add_cache_table_command(CLI::App& root);
void add_logits_command(CLI::App& root);
void add_tokenize_command(CLI::App& root);
void add_convert_command(CLI::App& root);
void add_bench_command(CLI::App& root);
void add_perplexity_command(CLI::App& root);
void add_compare_command(CLI::App& root);
void add_serve_command(CLI::App& root);
void add_make_random_command(CLI::App& root);
}  // namespace ptllm::cli
