// posttrainllm: command-line entry point. Each command is in app/cmd_*.cc.
#include <fmt/core.h>
#include <unistd.h>

#include <cstdlib>

#include <CLI/CLI.hpp>

#include "app/commands.h"
#include "core/error.h"

namespace {
// libgomp spin-waits by default, and reads its wait policy once, when it is
// loaded. On a machine whose cores are shared that spinning collapses
// throughput (flagship-27m decode at load average 14: 3 tokens/s spinning, 259
// passive), so unless the user chose a policy we choose "passive" and restart
// ourselves once for it to take effect. OMP_WAIT_POLICY=active restores
// spinning for dedicated machines.
void choose_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}
}  // namespace

int main(int argc, char** argv) {
  choose_omp_wait_policy(argv);
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
