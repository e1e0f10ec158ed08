// `sample`: prompt -> streamed text, then a short report on stderr (or one JSON object with --json).
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "kv/cache_options.h"

namespace ptllm::cli {
namespace {
std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted.store(true); }

// A "Name: N kB" field of /proc/self/status in KiB, or -1 where unavailable.
int64_t proc_status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kib = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      kib = std::strtoll(line + n + 1, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kib;
}
// Peak resident set size (VmHWM). It includes file-backed pages of the mmapped
// weights (an embedding row is paged in the first time its token is seen), so
// the anonymous part (RssAnon: the cache, buffers) is reported beside it.
int64_t peak_rss_kib() { return proc_status_kib("VmHWM"); }
int64_t anon_rss_kib() { return proc_status_kib("RssAnon"); }

// Stored tokens of every cache layer.
std::vector<int64_t> stored_per_layer(const KVCache& c) {
  std::vector<int64_t> v;
  for (int64_t l = 0; l < c.shape().n_layers; ++l) v.push_back(c.stored(l));
  return v;
}

// "stored 256 per layer" or "stored 256,256,...,255 per layer" when layers differ.
std::string stored_str(const std::vector<int64_t>& v) {
  bool same = std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v.front(); });
  if (same) return fmt::format("stored {} per layer", v.empty() ? 0 : v.front());
  std::string s = "stored ";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + " per layer";
}
}  // namespace

void add_sample_command(CLI::App& root) {
  struct Opts {
    std::string model, prompt;
    int64_t tokens = 128;
    double temperature = 0.8;
    int64_t top_k = 40;
    double top_p = 0.95;
    int64_t seed = -1;
    bool json = false, ignore_eos = false, no_bos = false;
    int threads = 0;
    int64_t report_every = 0;
    CacheOptions cache;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("sample", "Generate text from a prompt");
  cmd->add_option("model", o->model, "Model folder or .tinygpt file (default: the bundled models/flagship-27m.tinygpt)");
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text")->required();
  cmd->add_option("--tokens,-n", o->tokens, "Tokens to generate (default 128)");
  cmd->add_option("--temperature,-t", o->temperature, "Sampling temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", o->top_k, "Keep the K most likely tokens; 0 = off (default 40)");
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]; 1 = off (default 0.95)");
  cmd->add_option("--seed", o->seed, "RNG seed (default: random, printed in the report)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after the end-of-sequence token");
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token to the prompt");
  cmd->add_flag("--json", o->json, "Print one JSON object (ids, text, stats) instead of streaming text");
  add_threads_flag(cmd, o->threads);
  add_cache_flags(cmd, o->cache);
  cmd->add_option("--report-every", o->report_every,
                  "Every K generated tokens, print cache position, stored tokens per layer and peak RSS on stderr")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([o] {
    if (o->tokens < 0) fail("--tokens {}: expected a number >= 0", o->tokens);
    validate(o->cache);  // cross-flag rules (sink without window) before loading anything
    SamplerConfig sc;
    sc.temperature = o->temperature;
    sc.top_k = o->top_k;
    sc.top_p = o->top_p;
    sc.seed = o->seed >= 0 ? uint64_t(o->seed) : std::random_device{}();
    validate(sc);
    apply_threads(o->threads);
    const std::string path = o->model.empty() ? default_model_path() : o->model;
    LoadedModel lm = load_model(path);
    if (!lm.tokenizer) fail("{}: no tokenizer.json beside the model (needed to encode --prompt)", path);
    std::vector<int32_t> prompt = lm.tokenizer->encode(o->prompt, !o->no_bos);
    if (prompt.empty()) {
      if (lm.bos_id < 0) fail("--prompt is empty and the model has no BOS token to start from");
      prompt.push_back(lm.bos_id);
    }
    const auto& cfg = lm.model->config();
    if (int64_t(prompt.size()) > cfg.max_position)
      fail("--prompt: {} tokens is longer than the model's context of {} tokens", prompt.size(), cfg.max_position);
    // Unbounded: room for the whole run, up to the context. StreamingLLM: N+M
    // slots (make_cache), so generation can go past the context.
    const int64_t capacity = std::min<int64_t>(cfg.max_position, std::max<int64_t>(int64_t(prompt.size()) + o->tokens, 1));
    auto cache = make_cache(lm.model->cache_shape(capacity), o->cache);
    fmt::print(stderr, "{}\n", cache->describe());
    Session session(lm, std::move(cache));

    GenerateOptions go;
    go.max_new_tokens = o->tokens;
    go.ignore_eos = o->ignore_eos;
    go.sampler = sc;
    std::vector<int32_t> generated;
    StreamDecoder stream(*lm.tokenizer);
    g_interrupted = false;
    auto old = std::signal(SIGINT, on_sigint);
    // Decode speed of each report interval, timed from token to token (the
    // first interval starts at the first generated token, after the prefill).
    auto mark = std::chrono::steady_clock::now();
    int64_t mark_count = 1;
    GenerateStats st = session.generate(prompt, go, [&](int32_t id) {
      generated.push_back(id);
      if (generated.size() == 1) mark = std::chrono::steady_clock::now();
      if (o->report_every > 0 && int64_t(generated.size()) % o->report_every == 0) {
        const auto now = std::chrono::steady_clock::now();
        const double dt = std::chrono::duration<double>(now - mark).count();
        const int64_t n = int64_t(generated.size()) - mark_count;
        const KVCache& c = session.cache();
        const auto st = stored_per_layer(c);
        fmt::print(stderr,
                   "[kv] generated {} · position {} · {} (max {}) · kv {} bytes · peak RSS {} KiB · anon RSS {} KiB"
                   " · decode {:.1f} tok/s over the last {}\n",
                   generated.size(), c.position(), stored_str(st), *std::max_element(st.begin(), st.end()),
                   c.payload_bytes() + c.scale_bytes(), peak_rss_kib(), anon_rss_kib(), dt > 0 ? double(n) / dt : 0.0,
                   n);
        mark = std::chrono::steady_clock::now();
        mark_count = int64_t(generated.size());
      }
      if (!o->json) {
        std::string piece = stream.push(id);
        if (!piece.empty()) {
          std::fwrite(piece.data(), 1, piece.size(), stdout);
          std::fflush(stdout);
        }
      }
      return !g_interrupted.load();
    });
    std::signal(SIGINT, old);
    const std::string text = lm.tokenizer->decode(generated);
    const auto& cache_ref = session.cache();
    const std::vector<int64_t> stored = stored_per_layer(cache_ref);
    const int64_t max_stored = stored.empty() ? 0 : *std::max_element(stored.begin(), stored.end());
    if (o->json) {
      nlohmann::json j;
      j["model"] = path;
      j["prompt"] = o->prompt;
      j["prompt_ids"] = prompt;
      j["generated_ids"] = generated;
      j["text"] = text;
      j["stats"] = {{"prompt_tokens", st.prompt_tokens},
                    {"generated_tokens", st.generated_tokens},
                    {"prefill_seconds", st.prefill_seconds},
                    {"decode_seconds", st.decode_seconds},
                    {"prefill_tokens_per_second", st.prefill_tps()},
                    {"decode_tokens_per_second", st.decode_tps()},
                    {"stop_reason", stop_reason_name(st.stop)},
                    {"seed", sc.seed},
                    {"kv_cache_bytes", cache_ref.payload_bytes() + cache_ref.scale_bytes()},
                    {"kv_cache_payload_bytes", cache_ref.payload_bytes()},
                    {"kv_cache_scale_bytes", cache_ref.scale_bytes()},
                    {"kv_cache", cache_ref.describe()},
                    {"kv_quantize", storage_name(o->cache.storage)},
                    {"streaming_llm_sink", o->cache.sink},
                    {"streaming_llm_window", o->cache.window},
                    {"streaming_llm_rope", rope_mode_name(o->cache.rope_mode)},
                    {"kv_cache_bounded", cache_ref.bounded()},
                    {"stored_tokens", max_stored},
                    {"stored_tokens_per_layer", stored},
                    {"position", cache_ref.position()},
                    {"kv_layers", cfg.n_cache_layers()},
                    {"model_layers", cfg.n_layers},
                    {"peak_rss_kib", peak_rss_kib()},
                    {"anon_rss_kib", anon_rss_kib()}};
      fmt::print("{}\n", j.dump(2));
    } else {
      std::string rest = stream.flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
      if (st.stop == StopReason::Context)
        fmt::print(stderr, "note: stopped at the model's context length ({} tokens); a bounded cache "
                           "(--streaming-llm-sink/--streaming-llm-window) lets generation go on\n",
                   cfg.max_position);
      fmt::print(stderr,
                 "prompt {} tokens · generated {} tokens · prefill {:.1f} tok/s · decode {:.1f} tok/s · "
                 "stop: {} · seed {}\n",
                 st.prompt_tokens, st.generated_tokens, st.prefill_tps(), st.decode_tps(), stop_reason_name(st.stop),
                 sc.seed);
      // The cache: bytes held (payload + scales), stored tokens, and the monotonic
      // position when eviction made them differ.
      std::string where = stored_str(stored);
      if (max_stored != cache_ref.position())
        where = fmt::format("position {} ({} generated) · {}{}", cache_ref.position(), st.generated_tokens, where,
                            cache_ref.bounded() ? " (StreamingLLM cap)" : "");
      // YOCO: say how many layers' worth of K/V exist at all (the depth saving).
      const std::string layers = cfg.yoco() ? fmt::format(" · {} of {} layers hold K/V (YOCO)", cfg.n_cache_layers(), cfg.n_layers) : "";
      fmt::print(stderr, "kv cache {} bytes = {} payload + {} scales · {}{} · peak RSS {} KiB\n",
                 cache_ref.payload_bytes() + cache_ref.scale_bytes(), cache_ref.payload_bytes(),
                 cache_ref.scale_bytes(), where, layers, peak_rss_kib());
    }
  });
}

}  // namespace ptllm::cli
