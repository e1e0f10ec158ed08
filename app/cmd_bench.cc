// `bench`: prefill and decode throughput of the forward pass, llama-bench style.
//
// Each repeat builds a fresh cache, times one forward over --prompt-tokens
// (prefill), then times --gen-tokens single-token forwards (decode). With
// --depth D the decode is timed after the cache already holds D tokens (the
// fill itself is not timed), so decode speed at a given context is visible.
// Tokens are deterministic pseudo-random ids: speed does not depend on them.
// Results are mean ± sample standard deviation over the repeats, after one
// untimed warm-up repeat (page faults of the mmapped weights, cache warm-up).
//
// --interleave-depths D1,D2,...: one cache per depth, each filled untimed to
// its depth; then --repeat rounds in which every cache in turn decodes
// --gen-tokens timed tokens. Alternating the caches within one process cancels
// the drift of a shared machine, which a 1k-vs-100k comparison of separate
// runs cannot (issue 8's flat-cost check: scripts/bench_flat.sh).
#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <nlohmann/json.hpp>
#include <memory>
#include <random>
#include <thread>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "kv/cache_options.h"
#include "ops/ops.h"

namespace ptllm::cli {
namespace {

struct Stat {
  double mean = 0, sd = 0;
};
Stat stats(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

// CPU seconds used by the whole process (all threads).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is KiB on Linux
}

// n deterministic pseudo-random ids, avoiding the first few (special) ids.
std::vector<int32_t> bench_ids(const ModelConfig& cfg, int64_t n) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int32_t> pick(std::min<int32_t>(3, cfg.vocab_size - 1), cfg.vocab_size - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = pick(rng);
  return ids;
}

// Feeds ids[0, depth) into `cache` (untimed fill): chunks of at most 512, or
// one token per step once a bounded cache is full.
void fill_cache(const Model& model, const std::vector<int32_t>& ids, int64_t depth, KVCache& cache,
                std::vector<float>& logits) {
  for (int64_t off = 0; off < depth;) {
    const int64_t chunk = std::min<int64_t>({depth - off, std::max<int64_t>(cache.room(), 1), 512});
    model.forward(ids.data() + off, chunk, cache, logits.data(), false);
    off += chunk;
  }
}

// --interleave-depths: see the file comment.
void run_interleaved(const LoadedModel& lm, const std::vector<int64_t>& depths, int64_t gen, int64_t repeat,
                     const CacheOptions& copt, bool json, const std::string& path) {
  const Model& model = *lm.model;
  const auto& cfg = model.config();
  if (gen < 1) fail("--interleave-depths needs --gen-tokens >= 1");
  int64_t max_depth = 0;
  for (int64_t d : depths) {
    if (d < 0) fail("--interleave-depths {}: expected depths >= 0", d);
    max_depth = std::max(max_depth, d);
  }
  const int64_t total = gen * (repeat + 1);  // one untimed warm-up round
  const std::vector<int32_t> ids = bench_ids(cfg, max_depth + total);
  std::vector<float> logits(size_t(cfg.vocab_size));
  std::vector<std::unique_ptr<KVCache>> caches;
  for (int64_t d : depths) {
    caches.push_back(make_cache(model.cache_shape(std::max<int64_t>(d + total, 1)), copt));
    fill_cache(model, ids, d, *caches.back(), logits);
  }
  using clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> tps(depths.size());
  for (int64_t r = 0; r <= repeat; ++r)
    for (size_t k = 0; k < depths.size(); ++k) {
      KVCache& c = *caches[k];
      const int64_t at = depths[k] + r * gen;
      const auto t0 = clock::now();
      for (int64_t i = 0; i < gen; ++i) model.forward(&ids[size_t(at + i)], 1, c, logits.data(), false);
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (r > 0) tps[k].push_back(double(gen) / s);
    }
  if (json) {
    nlohmann::json j;
    j["model"] = path;
    j["threads"] = ops::num_threads();
    j["cache"] = describe(copt);
    j["peak_rss_mib"] = peak_rss_mib();
    for (size_t k = 0; k < depths.size(); ++k) {
      const Stat st = stats(tps[k]);
      j["interleaved"].push_back({{"depth", depths[k]},
                                  {"tokens", gen},
                                  {"tps_mean", st.mean},
                                  {"tps_sd", st.sd},
                                  {"tps", tps[k]},
                                  {"stored_at_end", caches[k]->stored(0)},
                                  {"cache_bytes_at_end", caches[k]->payload_bytes() + caches[k]->scale_bytes()}});
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model {} · {} threads · cache {} · {} interleaved rounds of {} tokens per depth\n", path,
             ops::num_threads(), describe(copt), repeat, gen);
  fmt::print("| test              |        tokens/s | ms/token | stored | cache bytes |\n"
             "| ----------------- | --------------: | -------: | -----: | ----------: |\n");
  for (size_t k = 0; k < depths.size(); ++k) {
    const Stat st = stats(tps[k]);
    fmt::print("| {:<17} | {:>7.1f} ± {:>5.1f} | {:>8.3f} | {:>6} | {:>11} |\n", fmt::format("tg{} @ d{}", gen, depths[k]),
               st.mean, st.sd, 1000.0 / st.mean, caches[k]->stored(0),
               caches[k]->payload_bytes() + caches[k]->scale_bytes());
  }
  if (depths.size() >= 2) {
    const double first = stats(tps.front()).mean, last = stats(tps.back()).mean;
    fmt::print("time per token at d{} / at d{}: {:.3f}\n", depths.back(), depths.front(), first / last);
  }
  fmt::print("peak RSS {:.1f} MiB\n", peak_rss_mib());
}

}  // namespace

void add_bench_command(CLI::App& root) {
  struct Opts {
    std::string model;
    int64_t prompt_tokens = 512, gen_tokens = 128, repeat = 5, depth = 0;
    std::vector<int64_t> interleave;
    bool json = false, no_warmup = false;
    int threads = 0;
    CacheOptions cache;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("bench", "Measure prefill and decode tokens/s (mean ± sd over repeats)");
  cmd->add_option("model", o->model, "Model folder (default: the bundled flagship-27m)");
  cmd->add_option("--prompt-tokens,-p", o->prompt_tokens, "Prompt length for the prefill test; 0 = skip (default 512)");
  cmd->add_option("--gen-tokens,-n", o->gen_tokens, "Tokens decoded one at a time; 0 = skip (default 128)");
  cmd->add_option("--repeat,-r", o->repeat, "Timed repetitions (default 5)");
  cmd->add_option("--depth,-d", o->depth,
                  "Tokens already in the cache before the decode test (filled untimed; default 0)");
  cmd->add_option("--interleave-depths", o->interleave,
                  "Comma list of depths: one cache per depth, filled untimed, then --repeat rounds of --gen-tokens "
                  "timed decode steps on each cache in turn (prefill is not timed)")
      ->delimiter(',');
  cmd->add_flag("--no-warmup", o->no_warmup, "Skip the untimed warm-up repetition");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  add_threads_flag(cmd, o->threads);
  add_cache_flags(cmd, o->cache);
  cmd->callback([o] {
    if (o->prompt_tokens < 0) fail("--prompt-tokens {}: expected >= 0", o->prompt_tokens);
    if (o->gen_tokens < 0) fail("--gen-tokens {}: expected >= 0", o->gen_tokens);
    if (o->repeat < 1) fail("--repeat {}: expected >= 1", o->repeat);
    if (o->depth < 0) fail("--depth {}: expected >= 0", o->depth);
    if (o->prompt_tokens == 0 && o->gen_tokens == 0) fail("--prompt-tokens and --gen-tokens are both 0: nothing to time");
    validate(o->cache);
    apply_threads(o->threads);
    const std::string path = o->model.empty() ? default_model_path() : o->model;
    LoadedModel lm = load_model(path);
    const Model& model = *lm.model;
    const auto& cfg = model.config();

    if (!o->interleave.empty()) {
      run_interleaved(lm, o->interleave, o->gen_tokens, o->repeat, o->cache, o->json, path);
      return;
    }
    const int64_t fill = std::max(o->prompt_tokens, o->depth);
    const std::vector<int32_t> ids = bench_ids(cfg, fill + o->gen_tokens + 1);

    // An unbounded cache must hold the prefill, or the fill plus the decode.
    const int64_t capacity = std::max<int64_t>({o->prompt_tokens, o->depth + o->gen_tokens, 1});
    std::vector<float> logits(size_t(cfg.vocab_size));
    using clock = std::chrono::steady_clock;
    auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };

    // Tokens per CPU-second beside tokens per wall-second: on a shared machine
    // a single-threaded run's CPU rate is what an idle core would give.
    std::vector<double> pp_tps, tg_tps, pp_cpu, tg_cpu;
    std::string cache_desc;
    size_t cache_bytes = 0;
    const int64_t runs = o->repeat + (o->no_warmup ? 0 : 1);
    for (int64_t r = 0; r < runs; ++r) {
      const bool timed = o->no_warmup || r > 0;
      if (o->prompt_tokens > 0) {
        auto cache = make_cache(model.cache_shape(capacity), o->cache);
        auto t0 = clock::now();
        const double c0 = process_cpu_seconds();
        for (int64_t off = 0; off < o->prompt_tokens;) {
          const int64_t chunk = std::min(o->prompt_tokens - off, std::max<int64_t>(cache->room(), 1));
          model.forward(ids.data() + off, chunk, *cache, logits.data(), false);
          off += chunk;
        }
        const double s = secs(t0, clock::now()), cs = process_cpu_seconds() - c0;
        if (timed) {
          pp_tps.push_back(double(o->prompt_tokens) / s);
          pp_cpu.push_back(double(o->prompt_tokens) / cs);
        }
      }
      if (o->gen_tokens > 0) {
        auto cache = make_cache(model.cache_shape(capacity), o->cache);
        fill_cache(model, ids, o->depth, *cache, logits);
        auto t0 = clock::now();
        const double c0 = process_cpu_seconds();
        for (int64_t i = 0; i < o->gen_tokens; ++i)
          model.forward(&ids[size_t(o->depth + i)], 1, *cache, logits.data(), false);
        const double s = secs(t0, clock::now()), cs = process_cpu_seconds() - c0;
        if (timed) {
          tg_tps.push_back(double(o->gen_tokens) / s);
          tg_cpu.push_back(double(o->gen_tokens) / cs);
        }
        cache_desc = cache->describe();
        cache_bytes = cache->payload_bytes() + cache->scale_bytes();
      }
    }
    const Stat pp = stats(pp_tps), tg = stats(tg_tps), ppc = stats(pp_cpu), tgc = stats(tg_cpu);
    // Bytes one decode step reads: every weight except the embedding table
    // (one row of it), unless the table doubles as the (tied) output head.
    size_t step_weight_bytes = model.weight_bytes();
    const auto& store = model.tensors();
    if (store.has("model.embed_tokens.weight") && store.has("lm_head.weight") && !cfg.tie_embeddings) {
      const TensorView& e = store.get("model.embed_tokens.weight");
      step_weight_bytes -= e.nbytes() - storage_bytes(e.dtype, size_t(e.cols()));
    }
    // The last decode step read the whole cache (K and V of every layer).
    const double step_bytes = double(step_weight_bytes + cache_bytes);
    const double achieved_gbs = step_bytes * tg.mean / 1e9;
    const int threads = ops::num_threads();
    const std::string simd(ops::simd_level_name(ops::simd_level()));
    if (o->json) {
      nlohmann::json j;
      j["model"] = path;
      j["threads"] = threads;
      j["simd"] = simd;
      j["repeat"] = o->repeat;
      j["weight_bytes"] = model.weight_bytes();
      j["cache"] = describe(o->cache);
      j["peak_rss_mib"] = peak_rss_mib();
      if (o->prompt_tokens > 0)
        j["prefill"] = {{"tokens", o->prompt_tokens}, {"tps_mean", pp.mean}, {"tps_sd", pp.sd}, {"tps", pp_tps},
                        {"tokens_per_cpu_second_mean", ppc.mean}};
      if (o->gen_tokens > 0)
        j["decode"] = {{"tokens", o->gen_tokens}, {"depth", o->depth},     {"tps_mean", tg.mean},
                       {"tps_sd", tg.sd},         {"tps", tg_tps},         {"cache_bytes_at_end", cache_bytes},
                       {"tokens_per_cpu_second_mean", tgc.mean},
                       {"cache_desc", cache_desc},
                       {"weight_bytes_per_token", step_weight_bytes},
                       {"cache_bytes_per_token", cache_bytes},
                       {"achieved_read_gb_per_s", achieved_gbs}};
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("model {} · {} threads · {} · cache {} · weights {:.1f} MB · {} repeats\n", path, threads, simd,
               describe(o->cache), double(model.weight_bytes()) / 1e6, o->repeat);
    fmt::print("| test           |        tokens/s | tokens/CPU-s |\n| -------------- | --------------: | -----------: |\n");
    if (o->prompt_tokens > 0)
      fmt::print("| {:<14} | {:>7.1f} ± {:>5.1f} | {:>12.1f} |\n", fmt::format("pp{}", o->prompt_tokens), pp.mean, pp.sd,
                 ppc.mean);
    if (o->gen_tokens > 0) {
      const std::string name =
          o->depth > 0 ? fmt::format("tg{} @ d{}", o->gen_tokens, o->depth) : fmt::format("tg{}", o->gen_tokens);
      fmt::print("| {:<14} | {:>7.1f} ± {:>5.1f} | {:>12.1f} |\n", name, tg.mean, tg.sd, tgc.mean);
    }
    if (o->gen_tokens > 0)
      fmt::print("decode reads {:.1f} MB of weights + {:.2f} MB of cache per token (at the end) → {:.1f} GB/s achieved\n",
                 double(step_weight_bytes) / 1e6, double(cache_bytes) / 1e6, achieved_gbs);
    fmt::print("peak RSS {:.1f} MiB\n", peak_rss_mib());
    if (capacity > cfg.max_position)
      fmt::print("note: {} stored tokens exceeds the model's context of {} (speed only; outputs are not meaningful)\n",
                 capacity, cfg.max_position);
  });
}

}  // namespace ptllm::cli
