// `sample`: prompt -> streamed text, then a short report on stderr (or one JSON object with --json).
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/process.h"
#include "engine/session.h"

namespace ptllm::cli {
namespace {
std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted.store(true); }

struct SampleOpts {
  std::string model, prompt;
  int64_t tokens = 128;
  double temperature = 0.8;
  int64_t top_k = 40;
  double top_p = 0.95;
  double min_p = 0, presence_penalty = 0, frequency_penalty = 0;
  int64_t seed = -1;
  bool json = false, ignore_eos = false, no_bos = false;
  int threads = 0;
  WeightOpts weights;  // --weights, --mmap
  DeviceOpts device;
  int64_t report_every = 0;
  CacheSpec cache;
};

// "stored 256 per layer" or "stored 256,256,...,255 per layer" when layers differ.
std::string stored_str(const std::vector<int64_t>& v) {
  const bool same = std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v.front(); });
  if (same) return fmt::format("stored {} per layer", v.empty() ? 0 : v.front());
  std::string s = "stored ";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + " per layer";
}

// --report-every: one line per K generated tokens, with the decode speed of
// that interval timed from token to token (the first interval starts at the
// first generated token, after the prefill).
class IntervalReport {
 public:
  explicit IntervalReport(int64_t every) : every_(every) {}
  void on_token(int64_t generated, const KVCache& c) {
    if (generated == 1) mark_ = std::chrono::steady_clock::now();
    if (every_ <= 0 || generated % every_ != 0) return;
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - mark_).count();
    const int64_t n = generated - mark_count_;
    const CacheState st = cache_state(c);
    fmt::print(stderr,
               "[kv] generated {} · position {} · {} (max {}) · kv {} bytes · peak RSS {} KiB · anon RSS {} KiB"
               " · decode {:.1f} tok/s over the last {}\n",
               generated, st.position, stored_str(st.stored), st.max_stored(), st.bytes(), peak_rss_kib(),
               anon_rss_kib(), dt > 0 ? double(n) / dt : 0.0, n);
    mark_ = std::chrono::steady_clock::now();
    mark_count_ = generated;
  }

 private:
  int64_t every_;
  std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
  int64_t mark_count_ = 1;
};

nlohmann::json stats_json(const GenerateStats& st, uint64_t seed, const CacheSpec& spec, const KVCache& c,
                          const ModelConfig& cfg) {
  const CacheState cs = cache_state(c);
  return {{"prompt_tokens", st.prompt_tokens},
          {"generated_tokens", st.generated_tokens},
          {"prefill_seconds", st.prefill_seconds},
          {"decode_seconds", st.decode_seconds},
          {"prefill_tokens_per_second", st.prefill_tps()},
          {"decode_tokens_per_second", st.decode_tps()},
          {"stop_reason", stop_reason_name(st.stop)},
          {"seed", seed},
          {"kv_cache", spec.to_json()},
          {"kv_cache_bytes", cs.bytes()},
          {"kv_cache_payload_bytes", cs.payload_bytes},
          {"kv_cache_scale_bytes", cs.scale_bytes},
          {"stored_tokens", cs.max_stored()},
          {"stored_tokens_per_layer", cs.stored},
          {"position", cs.position},
          {"kv_layers", cfg.n_cache_layers()},
          {"model_layers", cfg.n_layers},
          {"peak_rss_kib", peak_rss_kib()},
          {"anon_rss_kib", anon_rss_kib()}};
}

// The stderr report after streamed text.
void print_report(const GenerateStats& st, uint64_t seed, const KVCache& c, const ModelConfig& cfg) {
  if (st.stop == StopReason::Context)
    fmt::print(stderr, "note: stopped at the model's context length ({} tokens); a bounded cache "
                       "(--streaming-llm-sink/--streaming-llm-window) lets generation go on\n",
               cfg.max_position);
  fmt::print(stderr,
             "prompt {} tokens · generated {} tokens · prefill {:.1f} tok/s · decode {:.1f} tok/s · "
             "stop: {} · seed {}\n",
             st.prompt_tokens, st.generated_tokens, st.prefill_tps(), st.decode_tps(), stop_reason_name(st.stop),
             seed);
  // Bytes held (payload + scales), stored tokens, and the monotonic position when eviction made them differ.
  const CacheState cs = cache_state(c);
  std::string where = stored_str(cs.stored);
  if (cs.max_stored() != cs.position)
    where = fmt::format("position {} ({} generated) · {}{}", cs.position, st.generated_tokens, where,
                        cs.bounded ? " (StreamingLLM cap)" : "");
  // YOCO: say how many layers' worth of K/V exist at all (the depth saving).
  const std::string layers =
      cfg.yoco() ? fmt::format(" · {} of {} layers hold K/V (YOCO)", cfg.n_cache_layers(), cfg.n_layers) : "";
  fmt::print(stderr, "kv cache {} bytes = {} payload + {} scales · {}{} · peak RSS {} KiB\n", cs.bytes(),
             cs.payload_bytes, cs.scale_bytes, where, layers, peak_rss_kib());
}

void run_sample(const SampleOpts& o) {
  if (o.tokens < 0) fail("--tokens {}: expected a number >= 0", o.tokens);
  GenerateOptions go;
  go.max_new_tokens = o.tokens;
  go.ignore_eos = o.ignore_eos;
  go.sampler = {o.temperature, o.top_k, o.top_p, o.seed >= 0 ? uint64_t(o.seed) : std::random_device{}()};
  go.sampler.min_p = o.min_p;
  go.sampler.presence_penalty = o.presence_penalty;
  go.sampler.frequency_penalty = o.frequency_penalty;
  validate(go.sampler);
  apply_threads(o.threads);
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  LoadedModel lm = load_model_opts(path, o.weights);
  const DeviceGuard device = apply_device(*lm.model, o.device);
  const std::vector<int32_t> prompt = encode_prompt(lm, o.prompt, !o.no_bos);
  Session session(lm, make_model_cache(*lm.model, o.cache, int64_t(prompt.size()) + o.tokens));
  fmt::print(stderr, "{}\n", session.cache().describe());

  std::vector<int32_t> generated;
  StreamDecoder stream(*lm.tokenizer);
  IntervalReport report(o.report_every);
  g_interrupted = false;
  auto old = std::signal(SIGINT, on_sigint);
  const GenerateStats st = session.generate(prompt, go, [&](int32_t id) {
    generated.push_back(id);
    report.on_token(int64_t(generated.size()), session.cache());
    if (!o.json) {
      const std::string piece = stream.push(id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return !g_interrupted.load();
  });
  std::signal(SIGINT, old);
  const auto& cfg = lm.model->config();
  if (o.json) {
    const nlohmann::json j = {{"model", path},
                              {"prompt", o.prompt},
                              {"prompt_ids", prompt},
                              {"generated_ids", generated},
                              {"text", lm.tokenizer->decode(generated)},
                              {"stats", stats_json(st, go.sampler.seed, o.cache, session.cache(), cfg)}};
    fmt::print("{}\n", j.dump(2));
    return;
  }
  const std::string rest = stream.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  print_report(st, go.sampler.seed, session.cache(), cfg);
}

}  // namespace

void add_sample_command(CLI::App& root) {
  auto o = std::make_shared<SampleOpts>();
  CLI::App* cmd = root.add_subcommand("sample", "Generate text from a prompt");
  cmd->add_option("model", o->model, "Model folder or .tinygpt file (default: the bundled models/flagship-27m.tinygpt)");
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text")->required();
  cmd->add_option("--tokens,-n", o->tokens, "Tokens to generate (default 128)");
  cmd->add_option("--temperature,-t", o->temperature, "Sampling temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", o->top_k, "Keep the K most likely tokens; 0 = off (default 40)");
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass in (0, 1]; 1 = off (default 0.95)");
  cmd->add_option("--min-p", o->min_p,
                  "Drop tokens less likely than this times the most likely one, in [0, 1]; 0 = off (default 0)");
  cmd->add_option("--presence-penalty", o->presence_penalty,
                  "Subtract this from the logit of every token already generated, in [-2, 2] (OpenAI's; default 0)");
  cmd->add_option("--frequency-penalty", o->frequency_penalty,
                  "Subtract this times its count from each generated token's logit, in [-2, 2] (OpenAI's; default 0)");
  cmd->add_option("--seed", o->seed, "RNG seed (default: random, printed in the report)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating after the end-of-sequence token");
  cmd->add_flag("--no-bos", o->no_bos, "Do not add the BOS token to the prompt");
  cmd->add_flag("--json", o->json, "Print one JSON object (ids, text, stats) instead of streaming text");
  add_threads_flag(cmd, o->threads);
  add_weights_flag(cmd, o->weights);
  add_device_flags(cmd, o->device);
  add_cache_flags(cmd, o->cache);
  cmd->add_option("--report-every", o->report_every,
                  "Every K generated tokens, print cache position, stored tokens per layer and peak RSS on stderr")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([o] { run_sample(*o); });
}

}  // namespace ptllm::cli
