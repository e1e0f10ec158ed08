// posttrainllm: command-line entry point. Each command is in app/cmd_*.cc.
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "core/error.h"
#include "engine/process.h"

namespace {
// libgomp spin-waits between parallel regions, and reads its wait policy once,
// when it is loaded. Measured on 2 cores with flagship-27m (docs/BENCHMARKS.md):
// idle, spinning decodes 880 tokens/s and sleeping ("passive") 116; at load
// average 14, spinning collapses to 3 tokens/s and passive keeps 259. So when
// the user chose no policy we look at the load once at start-up: if the cores
// are already busy we choose passive and restart ourselves once for libgomp
// to see it; otherwise libgomp's default (spin) stays. "Busy" is the number of
// tasks runnable right now (the 4th field of /proc/loadavg, less ourselves),
// not the 1-minute average: that one still counts our own previous run, so
// back-to-back runs on an idle machine would have gone passive (7x slower).
// Elsewhere (macOS: no /proc/loadavg, and the OpenMP there is LLVM's libomp,
// which spins only KMP_BLOCKTIME = 200 ms before sleeping) the default stays.
void choose_omp_wait_policy(char** argv) {
#if !defined(__linux__)
  return;
#endif
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  // Three readings 5 ms apart, the smallest kept: a single reading catches
  // short-lived tasks (a shell, a kernel thread) as often as real load.
  long running = 1L << 30;
  for (int i = 0; i < 3; ++i) {
    double avg1 = 0, avg5 = 0, avg15 = 0;
    long r = 0, total = 0;
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf %lf %lf %ld/%ld", &avg1, &avg5, &avg15, &r, &total) == 5) running = std::min(running, r);
      std::fclose(f);
    }
    if (i < 2) ::usleep(5000);
  }
  if (running == 1L << 30) return;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  const long others = running - 1;  // the count includes this process
  if (cores <= 0 || double(others) < 0.75 * double(cores)) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  const std::string exe = ptllm::self_exe_path();
  if (!exe.empty()) ::execv(exe.c_str(), argv);  // returns only on failure: then run as we are
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
  ptllm::cli::add_serve_command(app);
  ptllm::cli::add_make_random_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const ptllm::CacheSpecError& e) {
    fmt::print(stderr, "error: {}\n", ptllm::cli::flag_message(e));
    return 1;
  } catch (const ptllm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
