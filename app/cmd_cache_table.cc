// `cache-table`: KV cache bytes per storage mode and length (with the KIVI
// group/residual and K/V overrides of --kivi-group, --kivi-residual,
// --kv-quantize-k, --kv-quantize-v), measured by eval::cache_table.
#include <fmt/core.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "eval/cache_table.h"

namespace ptllm::cli {
namespace {

struct TableOpts {
  std::string model, lengths = "128,256,384,500,1024,2048";
  bool json = false;
  // Planner: --budget BYTES --length N [--quality FILE].
  std::string budget, quality;
  int64_t length = 0;
  CacheSpec cache;  // --kv-quantize-k/-v, --kivi-group, --kivi-residual; storage set per column
};

std::string grouped(size_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

// The KIVI line above the table, when a column is quantised.
std::string kivi_note(const eval::CacheTable& t, const CacheSpec& base) {
  if (std::none_of(t.columns.begin(), t.columns.end(), [](const CacheSpec& c) { return c.quantised(); })) return "";
  if (base.kivi_group == 0) return "KIVI simple scheme (--kivi-group 0): K scales over all stored tokens, no residual";
  return fmt::format("KIVI grouped: K scales per {} tokens, newest {}..{} tokens full precision", base.kivi_group,
                     base.kivi_residual, base.kivi_residual + base.kivi_group - 1);
}

nlohmann::json table_json(const eval::CacheTable& t, const std::string& path, const KVCacheShape& shape) {
  nlohmann::json j = {{"model", path}, {"layers", shape.n_layers}, {"kv_heads", shape.n_kv_heads},
                      {"head_dim", shape.head_dim}};
  for (const CacheSpec& c : t.columns) j["columns"].push_back(c.to_json());
  for (size_t r = 0; r < t.lengths.size(); ++r) {
    nlohmann::json row = {{"tokens", t.lengths[r]}};
    for (size_t c = 0; c < t.columns.size(); ++c) {
      const eval::CacheBytes& b = t.cells[r][c];
      row[t.columns[c].storage_label()] = {{"payload", b.payload}, {"scales", b.scales}, {"total", b.total()}};
    }
    j["rows"].push_back(row);
  }
  return j;
}

void print_table(const eval::CacheTable& t, const CacheSpec& base, const std::string& path, const KVCacheShape& shape) {
  fmt::print("KV cache bytes, {}: {} cache layers x {} KV heads x head_dim {} (measured from cache objects)\n", path,
             shape.n_layers, shape.n_kv_heads, shape.head_dim);
  if (const std::string k = kivi_note(t, base); !k.empty()) fmt::print("{}\n", k);
  fmt::print("{:>7}", "tokens");
  for (const CacheSpec& c : t.columns) fmt::print("  {:>26}", c.storage_label());
  fmt::print("\n");
  for (size_t r = 0; r < t.lengths.size(); ++r) {
    fmt::print("{:>7}", t.lengths[r]);
    for (const eval::CacheBytes& b : t.cells[r]) {
      std::string cell = grouped(b.payload);
      if (b.scales) cell += " + " + grouped(b.scales) + " sc";
      fmt::print("  {:>26}", cell);
    }
    fmt::print("\n");
  }
  fmt::print("(\"+ N sc\": fp16 scale+zero bytes of KIVI; formula in docs/CACHE.md)\n");
}

// "64 MiB" style, for the planner's lines.
std::string human(size_t b) {
  if (b >= (size_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(size_t(1) << 30));
  if (b >= (size_t(1) << 20)) return fmt::format("{:.2f} MiB", double(b) / double(size_t(1) << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", double(b) / 1024.0);
  return fmt::format("{} B", b);
}

void run_plan(const TableOpts& o) {
  if (o.length < 1) fail("--length {}: expected a token count >= 1 (with --budget)", o.length);
  const size_t budget = eval::parse_byte_size(o.budget, "--budget");
  nlohmann::json q;
  if (!o.quality.empty()) {
    std::ifstream f(o.quality);
    if (!f) fail("--quality {}: cannot open the file", o.quality);
    try {
      q = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      fail("--quality {}: not JSON ({})", o.quality, e.what());
    }
  }
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  LoadedModel lm = load_model(path);
  const auto shape = lm.model->cache_shape(1);
  const int64_t ctx = lm.model->config().max_position > 0 ? lm.model->config().max_position : o.length;
  const eval::Plan plan = eval::plan_cache(shape, budget, o.length, ctx, o.quality.empty() ? nullptr : &q);
  const auto qtext = [&](const eval::PlanRow& r) {
    return r.quality ? fmt::format("{:.6g}", *r.quality) : std::string("not measured");
  };
  if (o.json) {
    nlohmann::json j = {{"model", path},     {"budget_bytes", budget}, {"length", o.length},
                        {"metric", plan.metric}, {"considered", plan.considered}};
    j["fits"] = nlohmann::json::array();
    for (const auto& r : plan.rows)
      j["fits"].push_back({{"kv_cache", r.spec.to_json()},
                           {"stored_tokens", r.stored},
                           {"bytes", r.bytes.total()},
                           {"quality", r.quality ? nlohmann::json(*r.quality) : nlohmann::json(nullptr)}});
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("Cache settings for {} tokens within {} ({} bytes), {}: {} cache layers x {} KV heads x head_dim {}\n",
             o.length, human(budget), grouped(budget), path, shape.n_layers, shape.n_kv_heads, shape.head_dim);
  fmt::print("{} of {} candidate settings fit; bytes = the most the cache holds at any step up to {} tokens; "
             "quality = {} from {} (lower is better)\n",
             plan.rows.size(), plan.considered, o.length, plan.metric.empty() ? "-" : plan.metric,
             o.quality.empty() ? "(no --quality file)" : o.quality);
  if (plan.rows.empty()) {
    fmt::print("nothing fits: the smallest setting needs more than {}\n", human(budget));
    return;
  }
  fmt::print("{:>4}  {:<72} {:>9} {:>16} {:>7}  {}\n", "rank", "setting", "stored", "bytes", "budget", "quality");
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const auto& r = plan.rows[i];
    fmt::print("{:>4}  {:<72} {:>9} {:>16} {:>6.1f}%  {}\n", i + 1, r.spec.label(true), r.stored,
               grouped(r.bytes.total()), 100.0 * double(r.bytes.total()) / double(budget), qtext(r));
  }
  const auto& best = plan.rows.front();
  fmt::print("\nfor {} and {} tokens, use: {}{}\n", human(budget), o.length, best.spec.label(true),
             best.quality ? fmt::format(" ({} {})", plan.metric, qtext(best)) : std::string(" (no setting measured)"));
}

void run_cache_table(const TableOpts& o) {
  if (!o.budget.empty()) return run_plan(o);
  if (o.length != 0 || !o.quality.empty()) fail("--length / --quality: expected with --budget (the planner)");
  std::vector<int64_t> lengths;
  for (int32_t t : parse_id_list(o.lengths, "--lengths")) {
    if (t < 1) fail("--lengths {}: expected token counts >= 1", o.lengths);
    lengths.push_back(t);
  }
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  LoadedModel lm = load_model(path);
  const eval::CacheTable t = eval::cache_table(*lm.model, o.cache, lengths);
  const auto shape = lm.model->cache_shape(1);
  if (o.json) fmt::print("{}\n", table_json(t, path, shape).dump(2));
  else print_table(t, o.cache, path, shape);
}

}  // namespace

void add_cache_table_command(CLI::App& root) {
  auto o = std::make_shared<TableOpts>();
  CLI::App* cmd = root.add_subcommand("cache-table", "KV cache bytes per --kv-quantize mode, measured from cache objects");
  cmd->add_option("model", o->model, "Model folder or .tinygpt (default: the bundled flagship-27m)");
  cmd->add_option("--lengths", o->lengths, "Comma-separated token counts (default 128,256,384,500,1024,2048)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->add_option("--budget", o->budget,
                  "Planner: list every cache setting whose bytes fit BYTES (e.g. 64MiB, 1.5GiB, 67108864) at "
                  "--length tokens, best quality first");
  cmd->add_option("--length", o->length, "Planner: tokens the cache must serve (with --budget)");
  cmd->add_option("--quality", o->quality,
                  "Planner: a `perplexity --json` file; each setting's through_cache kl_divergence.mean (or ppl) "
                  "ranks it; settings it lacks are 'not measured'");
  add_kivi_flags(cmd, o->cache);
  cmd->footer(
      "One column per --kv-quantize mode. --kivi-group/--kivi-residual apply to the int8/int4/int2 columns "
      "(--kivi-group 0: the simple scheme); --kv-quantize-k/--kv-quantize-v fix K or V in every column (columns "
      "that give the same cache are shown once).");
  cmd->callback([o] { run_cache_table(*o); });
}

}  // namespace ptllm::cli
