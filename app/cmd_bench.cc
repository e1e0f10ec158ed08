// `bench`: prefill and decode throughput of the decode loop, llama-bench style
// (what is timed and how: engine/bench.h). Results are mean ± sample standard
// deviation over the repeats.
//
// --interleave-depths D1,D2,...: one cache per depth, decoded in turn within
// one process (issue 8's flat-cost check: scripts/bench_flat.sh).
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "engine/bench.h"
#include "engine/process.h"
#include "engine/session.h"
#include "ops/ops.h"

namespace ptllm::cli {
namespace {

struct BenchOpts {
  std::string model;
  BenchOptions bench;
  std::vector<int64_t> interleave;
  bool json = false, no_warmup = false;
  int threads = 0;
  WeightOpts weights;  // --weights, --mmap
  DeviceOpts device;
  CacheSpec cache;
};

double peak_rss_mib() { return double(peak_rss_kib()) / 1024.0; }
// MiB in huge pages, or null where the system does not say.
nlohmann::json huge_pages_json() {
  const int64_t kib = anon_huge_kib();
  return kib < 0 ? nlohmann::json(nullptr) : nlohmann::json(double(kib) / 1024.0);
}
// Peak RSS, and how much memory is in huge pages (the weights read into
// memory ask for them: io/mmap.h).
void print_rss() {
  const int64_t huge = anon_huge_kib();
  if (huge >= 0) fmt::print("peak RSS {:.1f} MiB ({:.1f} MiB in huge pages now)\n", peak_rss_mib(), double(huge) / 1024.0);
  else fmt::print("peak RSS {:.1f} MiB\n", peak_rss_mib());
}

void print_interleaved(const std::vector<InterleavedDepth>& res, const BenchOpts& o, const std::string& path) {
  const int64_t gen = o.bench.gen_tokens;
  if (o.json) {
    nlohmann::json j = {{"model", path}, {"threads", ops::num_threads()}, {"kv_cache", o.cache.to_json()},
                        {"peak_rss_mib", peak_rss_mib()},
                        {"huge_pages_mib", huge_pages_json()}};
    for (const auto& d : res) {
      const MeanSd st = mean_sd(d.tps);
      j["interleaved"].push_back({{"depth", d.depth}, {"tokens", gen}, {"tps_mean", st.mean}, {"tps_sd", st.sd},
                                  {"tps", d.tps}, {"stored_at_end", d.stored_at_end},
                                  {"cache_bytes_at_end", d.cache_bytes_at_end}});
    }
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model {} · {} threads · cache {} · {} interleaved rounds of {} tokens per depth\n", path,
             ops::num_threads(), o.cache.describe(), o.bench.repeat, gen);
  fmt::print("| test              |        tokens/s | ms/token | stored | cache bytes |\n"
             "| ----------------- | --------------: | -------: | -----: | ----------: |\n");
  for (const auto& d : res) {
    const MeanSd st = mean_sd(d.tps);
    fmt::print("| {:<17} | {:>7.1f} ± {:>5.1f} | {:>8.3f} | {:>6} | {:>11} |\n", fmt::format("tg{} @ d{}", gen, d.depth),
               st.mean, st.sd, 1000.0 / st.mean, d.stored_at_end, d.cache_bytes_at_end);
  }
  if (res.size() >= 2)
    fmt::print("time per token at d{} / at d{}: {:.3f}\n", res.back().depth, res.front().depth,
               mean_sd(res.front().tps).mean / mean_sd(res.back().tps).mean);
  print_rss();
}

nlohmann::json step_ms_json(const StepQuantiles& q) {
  return {{"steps", q.steps},  {"p50", q.p50 * 1e3}, {"p90", q.p90 * 1e3},
          {"p99", q.p99 * 1e3}, {"max", q.max * 1e3}, {"over_2x_median", q.over_2x_median}};
}

void print_json(const BenchResult& r, const BenchOpts& o, const Model& model, const std::string& path) {
  const BenchOptions& b = o.bench;
  const MeanSd pp = mean_sd(r.prefill_tps), tg = mean_sd(r.decode_tps);
  const StepQuantiles sq = step_quantiles(r.step_seconds);
  nlohmann::json j = {{"model", path},
                      {"threads", ops::num_threads()},
                      {"simd", ops::simd_level_name(ops::simd_level())},
                      {"repeat", b.repeat},
                      {"weight_bytes", model.weight_bytes()},
                      {"kv_cache", o.cache.to_json()},
                      {"peak_rss_mib", peak_rss_mib()},
                      {"huge_pages_mib", huge_pages_json()}};
  if (b.prompt_tokens > 0)
    j["prefill"] = {{"tokens", b.prompt_tokens}, {"tps_mean", pp.mean}, {"tps_sd", pp.sd}, {"tps", r.prefill_tps},
                    {"tokens_per_cpu_second_mean", mean_sd(r.prefill_cpu_tps).mean}};
  if (b.gen_tokens > 0 && b.batch > 1) {
    // One step of B tokens reads the weights once and every sequence's cache.
    const double steps = tg.mean / double(b.batch);
    j["decode"] = {{"tokens", b.gen_tokens},
                   {"batch", b.batch},
                   {"depth", b.depth},
                   {"fill", r.batch_fill},
                   {"tps_mean", tg.mean},
                   {"tps_sd", tg.sd},
                   {"tps", r.decode_tps},
                   {"ms_per_step", 1000.0 / steps},
                   {"step_ms", step_ms_json(sq)},
                   {"cache_bytes_at_end", r.cache_bytes},
                   {"batch_cache_bytes_at_end", r.batch_cache_bytes},
                   {"device_bytes_per_sequence", r.device_bytes},
                   {"cache_desc", r.cache_description},
                   {"weight_bytes_per_step", r.step_weight_bytes},
                   {"achieved_read_gb_per_s", double(r.step_weight_bytes + r.batch_cache_bytes) * steps / 1e9}};
  } else if (b.gen_tokens > 0)
    // The last decode step read every weight it needs and the whole cache.
    j["decode"] = {{"tokens", b.gen_tokens},
                   {"depth", b.depth},
                   {"tps_mean", tg.mean},
                   {"tps_sd", tg.sd},
                   {"tps", r.decode_tps},
                   {"cache_bytes_at_end", r.cache_bytes},
                   {"tokens_per_cpu_second_mean", mean_sd(r.decode_cpu_tps).mean},
                   {"step_ms", step_ms_json(sq)},
                   {"cache_desc", r.cache_description},
                   {"weight_bytes_per_token", r.step_weight_bytes},
                   {"cache_bytes_per_token", r.cache_bytes},
                   {"device_bytes_per_sequence", r.device_bytes},
                   {"achieved_read_gb_per_s", double(r.step_weight_bytes + r.cache_bytes) * tg.mean / 1e9}};
  fmt::print("{}\n", j.dump(2));
}

void print_table(const BenchResult& r, const BenchOpts& o, const Model& model, const std::string& path) {
  const BenchOptions& b = o.bench;
  const MeanSd pp = mean_sd(r.prefill_tps), tg = mean_sd(r.decode_tps);
  fmt::print("model {} · {} threads · {} · cache {} · weights {:.1f} MB · {} repeats\n", path, ops::num_threads(),
             ops::simd_level_name(ops::simd_level()), o.cache.describe(), double(model.weight_bytes()) / 1e6,
             b.repeat);
  fmt::print("| test           |        tokens/s | tokens/CPU-s |\n| -------------- | --------------: | -----------: |\n");
  if (b.prompt_tokens > 0)
    fmt::print("| {:<14} | {:>7.1f} ± {:>5.1f} | {:>12.1f} |\n", fmt::format("pp{}", b.prompt_tokens), pp.mean, pp.sd,
               mean_sd(r.prefill_cpu_tps).mean);
  if (b.gen_tokens > 0 && b.batch > 1) {
    const double steps = tg.mean / double(b.batch);
    fmt::print("| {:<14} | {:>7.1f} ± {:>5.1f} | {:>12.1f} |\n", fmt::format("tg{} x{} @ d{}", b.gen_tokens, b.batch, b.depth),
               tg.mean, tg.sd, mean_sd(r.decode_cpu_tps).mean);
    fmt::print("batch of {} ({}): {:.3f} ms per step; a step reads {:.1f} MB of weights + {:.1f} MB of caches "
               "→ {:.1f} GB/s achieved\n",
               b.batch, r.batch_fill, 1000.0 / steps, double(r.step_weight_bytes) / 1e6,
               double(r.batch_cache_bytes) / 1e6, double(r.step_weight_bytes + r.batch_cache_bytes) * steps / 1e9);
  } else if (b.gen_tokens > 0) {
    const std::string name =
        b.depth > 0 ? fmt::format("tg{} @ d{}", b.gen_tokens, b.depth) : fmt::format("tg{}", b.gen_tokens);
    fmt::print("| {:<14} | {:>7.1f} ± {:>5.1f} | {:>12.1f} |\n", name, tg.mean, tg.sd, mean_sd(r.decode_cpu_tps).mean);
    fmt::print("decode reads {:.1f} MB of weights + {:.2f} MB of cache per token (at the end) → {:.1f} GB/s achieved\n",
               double(r.step_weight_bytes) / 1e6, double(r.cache_bytes) / 1e6,
               double(r.step_weight_bytes + r.cache_bytes) * tg.mean / 1e9);
  }
  if (b.gen_tokens > 0) {
    const StepQuantiles q = step_quantiles(r.step_seconds);
    fmt::print("decode step ms over {} timed steps: p50 {:.3f} · p90 {:.3f} · p99 {:.3f} · max {:.3f} · {} over 2x the "
               "median\n",
               q.steps, q.p50 * 1e3, q.p90 * 1e3, q.p99 * 1e3, q.max * 1e3, q.over_2x_median);
  }
  print_rss();
  if (r.capacity > model.config().max_position)
    fmt::print("note: {} stored tokens exceeds the model's context of {} (speed only; outputs are not meaningful)\n",
               r.capacity, model.config().max_position);
}

void run(BenchOpts& o) {
  o.bench.warmup = !o.no_warmup;
  apply_threads(o.threads);
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  LoadedModel lm = load_model_opts(path, o.weights);
  const DeviceGuard device = apply_device(*lm.model, o.device);
  if (!o.interleave.empty() && o.bench.batch > 1) fail("--batch {}: not with --interleave-depths", o.bench.batch);
  if (!o.interleave.empty())
    return print_interleaved(run_interleaved(*lm.model, o.cache, o.interleave, o.bench.gen_tokens, o.bench.repeat),
                             o, path);
  const BenchResult r = run_bench(*lm.model, o.cache, o.bench);
  if (o.json) print_json(r, o, *lm.model, path);
  else print_table(r, o, *lm.model, path);
}

}  // namespace

void add_bench_command(CLI::App& root) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* cmd = root.add_subcommand("bench", "Measure prefill and decode tokens/s (mean ± sd over repeats)");
  cmd->add_option("model", o->model, "Model folder (default: the bundled flagship-27m)");
  cmd->add_option("--prompt-tokens,-p", o->bench.prompt_tokens,
                  "Prompt length for the prefill test; 0 = skip (default 512)");
  cmd->add_option("--gen-tokens,-n", o->bench.gen_tokens, "Tokens decoded one at a time; 0 = skip (default 128)");
  cmd->add_option("--repeat,-r", o->bench.repeat, "Timed repetitions (default 5)");
  cmd->add_option("--depth,-d", o->bench.depth,
                  "Tokens already in the cache before the decode test (filled untimed; default 0)");
  cmd->add_option("--batch,-b", o->bench.batch,
                  "Sequences decoded together (step_batch), each with its own cache at --depth: the first filled "
                  "by prefill, the others copied from it on a device, else prefilled (default 1)");
  cmd->add_option("--interleave-depths", o->interleave,
                  "Comma list of depths: one cache per depth, filled untimed, then --repeat rounds of --gen-tokens "
                  "timed decode steps on each cache in turn (prefill is not timed)")
      ->delimiter(',');
  cmd->add_flag("--no-warmup", o->no_warmup, "Skip the untimed warm-up repetition");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  add_threads_flag(cmd, o->threads);
  add_weights_flag(cmd, o->weights);
  add_device_flags(cmd, o->device);
  add_cache_flags(cmd, o->cache);
  cmd->callback([o] { run(*o); });
}

}  // namespace ptllm::cli
