// `serve`: the OpenAI-compatible HTTP server (docs/SERVER.md).
#include <fmt/core.h>
#include <malloc.h>
#include <sys/resource.h>

#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <thread>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "serve/chat_renderer.h"
#include "serve/engine_backend.h"
#include "serve/http_server.h"
#include "serve/scheduler.h"

namespace ptllm::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_term(int) { g_stop.store(true); }

// "256MiB", "1GiB", "512KiB", "1000000", "64MB" -> bytes.
size_t parse_bytes(const std::string& s, const char* flag) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  const std::string unit(p, s.data() + s.size());
  uint64_t mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "KiB" || unit == "K") mul = uint64_t(1) << 10;
  else if (unit == "MiB" || unit == "M") mul = uint64_t(1) << 20;
  else if (unit == "GiB" || unit == "G") mul = uint64_t(1) << 30;
  else if (unit == "KB") mul = 1000;
  else if (unit == "MB") mul = 1000 * 1000;
  else if (unit == "GB") mul = 1000 * 1000 * 1000;
  if (ec != std::errc() || p == s.data() || mul == 0 || v == 0 || v > (uint64_t(1) << 50) / mul)
    fail("{} {}: expected a positive size such as 256MiB, 1GiB, 512KiB or a byte count", flag, s);
  return size_t(v * mul);
}

// The chat template for `model_path` (or --chat-template FILE). The one place the
// jinja engine's ChatTemplate is wired in; until then no model has one, and chat
// requests get the 400 "model has no chat template".
// 1,000 simultaneous connections need as many descriptors; the soft limit is often 1,024.
void raise_fd_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

struct ServeOpts {
  std::string model, kv_budget = "256MiB", chat_template, max_body = "4MiB";
  int64_t max_sequences = 16, max_queue = 64, prefill_chunk = 64;
  int threads = 0, http_threads = 0, compute_nice = 10;
  WeightOpts weights;  // --weights, --mmap
  DeviceOpts device;
  serve::ServerOptions server;
  CacheSpec cache;
};

// SIGTERM/SIGINT: stop taking requests (503), let the running and queued ones finish, then return.
void run_until_signalled(serve::HttpServer& http, serve::Scheduler& sched) {
  std::thread listener([&] { http.serve(); });
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fmt::print(stderr, "posttrainllm serve: draining ({} running, {} queued)\n", sched.running(), sched.queued());
  http.begin_drain();
  while (!sched.idle() || http.in_flight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  http.stop();
  listener.join();
  fmt::print(stderr, "posttrainllm serve: stopped\n");
}

void serve_main(ServeOpts& o) {
  o.cache.check();
#ifdef M_MMAP_THRESHOLD
  // The first touch of a fresh page costs ~15 us on this project's VM
  // (core/memory.h), paid inside a step that every running stream waits for.
  // Caches are kept by the backend for later requests with the same settings
  // (keep_caches below); what else a request allocates (logits, sampler
  // buffers, a cache of other settings) stays in the heap when freed (glibc's
  // largest mmap threshold, no trimming), so the next request finds it
  // resident. RSS stays at the high-water mark, which the budget bounds.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
  serve::SchedulerConfig sc;
  sc.kv_budget = parse_bytes(o.kv_budget, "--kv-budget");
  sc.max_sequences = o.max_sequences;
  sc.max_queue = o.max_queue;
  sc.prefill_chunk = o.prefill_chunk;
  sc.prefill_tokens_per_step = o.prefill_chunk * 2;
  sc.compute_nice = o.compute_nice;
  o.server.max_body = parse_bytes(o.max_body, "--max-body");
  o.server.http_threads = o.http_threads > 0 ? o.http_threads : int(std::max<int64_t>(64, o.max_sequences + o.max_queue + 16));
  o.server.cache_defaults = o.cache;
  apply_threads(o.threads);
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  LoadedModel lm = load_model_opts(path, o.weights);
  const DeviceGuard device = apply_device(*lm.model, o.device);
  if (!lm.tokenizer) fail("{}: no tokenizer.json beside the model (the server decodes text)", path);
  o.server.model_name = std::filesystem::path(path).filename().string();
  if (o.server.model_name.empty()) o.server.model_name = std::filesystem::path(path).parent_path().filename().string();
  auto chat = serve::make_chat_renderer(path, o.chat_template, lm);
  auto backend = serve::make_engine_backend(lm);
  const size_t default_need = backend->reservation_bytes(o.cache);
  if (default_need > sc.kv_budget)
    fail("--kv-budget {}: one request with the default cache ({}) reserves {} bytes, more than the budget",
         o.kv_budget, o.cache.describe(), default_need);
  // Finished requests' caches are kept for the next ones (resident pages:
  // ~15 us per first touch of a 4 KiB page on this project's VM, core/memory.h),
  // within the budget; the caches of --max-sequences default requests (at most
  // 1 GiB of them) are made now, as llama-server allocates its slots at start-up.
  backend->keep_caches(sc.kv_budget, o.cache, std::min<int64_t>(o.max_sequences, int64_t((size_t(1) << 30) / std::max<size_t>(default_need, 1))));
  serve::Metrics metrics;
  serve::Scheduler sched(*backend, sc, &metrics);
  serve::HttpServer http(o.server, lm, *backend, sched, metrics, chat);
  const int port = http.bind();
  raise_fd_limit();
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a kill
  std::signal(SIGTERM, on_term);
  std::signal(SIGINT, on_term);
  sched.start();
  fmt::print(stderr, "posttrainllm serve: listening on http://{}:{} · model {} · kv budget {} bytes ({} per default request)\n",
             o.server.host, port, o.server.model_name, sc.kv_budget, default_need);
  std::fflush(stderr);
  run_until_signalled(http, sched);
}

}  // namespace

void add_serve_command(CLI::App& root) {
  auto o = std::make_shared<ServeOpts>();
  CLI::App* cmd = root.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  cmd->add_option("model", o->model, "Model folder or .tinygpt file (default: the bundled models/flagship-27m.tinygpt)");
  cmd->add_option("--host", o->server.host, "Address to listen on (default 127.0.0.1)");
  cmd->add_option("--port", o->server.port, "Port (default 8080; 0 = any free port, printed at start)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--kv-budget", o->kv_budget,
                  "KV cache memory all running requests may reserve together (default 256MiB)");
  cmd->add_option("--max-sequences", o->max_sequences, "Requests decoding at once (default 16)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  cmd->add_option("--max-queue", o->max_queue, "Requests waiting for admission before 429 (default 64)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("--api-key", o->server.api_key, "Require Authorization: Bearer KEY (not on /health, /metrics)");
  cmd->add_option("--chat-template", o->chat_template, "Jinja chat template file overriding the model's");
  cmd->add_option("--max-body", o->max_body, "Largest request body (default 4MiB; larger is 413)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens per sequence per step (default 64)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  cmd->add_option("--http-threads", o->http_threads,
                  "Connections served at once (default max(64, max-sequences + max-queue + 16))")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--compute-nice", o->compute_nice,
                  "Nice value of the decode threads, 0-19 (default 10: the HTTP threads get a core first, "
                  "so a token goes out at the step that made it; 0 leaves them as started)")
      ->check(CLI::Range(0, serve::kMaxComputeNice));
  add_threads_flag(cmd, o->threads);
  add_weights_flag(cmd, o->weights);
  add_device_flags(cmd, o->device);
  add_cache_flags(cmd, o->cache);
  cmd->callback([o] { serve_main(*o); });
}

}  // namespace ptllm::cli
