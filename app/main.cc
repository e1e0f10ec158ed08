// posttrainllm: command-line entry point. Each command is in app/cmd_*.cc.
#include <fmt/core.h>

#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"posttrainllm: long-context LLM decoding with a bounded, quantised KV cache"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "posttrainllm 0.1.0");
  ptllm::cli::add_sample_command(app);
  ptllm::cli::add_cache_table_command(app);
  ptllm::cli::add_logits_command(app);
  ptllm::cli::add_tokenize_command(app);
  ptllm::cli::add_convert_command(app);
  ptllm::cli::add_bench_command(app);
  ptllm::cli::add_perplexity_command(app);
  ptllm::cli::add_compare_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ptllm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
