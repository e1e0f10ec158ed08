// `perplexity`: how well a model predicts text, by full forward or through the
// KV cache (any cache settings, several in one run), in fixed windows or as
// long streams with eviction. Markdown table by default; --json / --csv; --plot
// writes an SVG of perplexity against stream position.
#include <fmt/core.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "eval/perplexity.h"
#include "eval/report.h"
#include "eval/sweep.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {
namespace {

std::string fmt_ppl(double p) { return std::isfinite(p) ? fmt::format("{:.4f}", p) : "n/a"; }
std::string fmt_bytes(size_t b) {
  if (b >= (size_t(1) << 20)) return fmt::format("{:.2f} MiB", double(b) / double(1 << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", double(b) / 1024.0);
  return fmt::format("{} B", b);
}

nlohmann::json run_json(const eval::RunResult& r) {
  nlohmann::json j = {{"ppl", r.total.ppl()},
                      {"mean_nll", r.total.mean_nll()},
                      {"predictions", r.total.count},
                      {"tokens_fed", r.tokens_fed},
                      {"seconds", r.seconds},
                      {"tokens_per_second", r.tokens_per_second()},
                      {"max_stored_tokens", r.max_stored},
                      {"max_cache_bytes", r.max_cache_bytes},
                      {"cache", r.cache}};
  nlohmann::json segs = nlohmann::json::array();
  for (size_t i = 0; i < r.segments.size(); ++i) {
    if (r.segments[i].count == 0) continue;
    segs.push_back({{"first", eval::Segments::first(int64_t(i))},
                    {"last", eval::Segments::last(int64_t(i))},
                    {"predictions", r.segments[i].count},
                    {"ppl", r.segments[i].ppl()}});
  }
  j["segments"] = segs;
  nlohmann::json bins = nlohmann::json::array();
  for (size_t i = 0; i < r.bins.size(); ++i)
    if (r.bins[i].count)
      bins.push_back({{"first", int64_t(i) * r.bin_size},
                      {"last", (int64_t(i) + 1) * r.bin_size - 1},
                      {"predictions", r.bins[i].count},
                      {"ppl", r.bins[i].ppl()}});
  j["bins"] = bins;
  return j;
}

struct PplOpts {
  std::string model, ids_file, plot;
  std::vector<std::string> files;
  int64_t window = 512, max_windows = 0, stream = 0, bin = 128;
  bool through_cache = false, cache_only = false, json = false, csv = false, quiet = false;
  eval::SweepFlags sweep;
  int threads = 0;
  DeviceOpts device;
};

// One result row: a cache setting and its runs.
struct Row {
  CacheSpec spec;
  std::string label;
  eval::RunResult full, cache;
};

void check_options(const PplOpts& o) {
  if (o.json && o.csv) fail("--json and --csv: choose one output format");
  if (o.files.empty() == o.ids_file.empty())
    fail("give either text files or --ids-file (got {})", o.files.empty() ? "neither" : "both");
  if (o.stream < 0 || o.stream == 1) fail("--stream {}: expected >= 2 tokens", o.stream);
  if (o.window < 2) fail("--window {}: expected >= 2", o.window);
  if (o.max_windows < 0) fail("--max-windows {}: expected >= 0 (0 = all)", o.max_windows);
  if (o.bin < 1) fail("--plot-bin {}: expected >= 1", o.bin);
  if (o.stream > 0 && (o.through_cache || o.cache_only))
    fail("--through-cache/--cache-only apply to window mode; stream mode always goes through the cache");
}

// The token streams: each --ids-file array, or BOS + file + EOS per text file.
std::vector<eval::Ids> read_inputs(const PplOpts& o, const LoadedModel& lm, std::vector<std::string>& names) {
  const int64_t V = lm.model->config().vocab_size;
  if (!o.ids_file.empty()) {
    auto inputs = eval::read_ids_file(o.ids_file, V);
    for (size_t i = 0; i < inputs.size(); ++i) names.push_back(fmt::format("{}[{}]", o.ids_file, i));
    return inputs;
  }
  if (!lm.tokenizer) fail("{}: no tokenizer.json beside the model (needed to read text files)", o.model);
  const int32_t eos = lm.eos_ids.empty() ? -1 : lm.eos_ids[0];
  auto inputs = eval::tokenize_files(o.files, *lm.tokenizer, lm.bos_id, eos);
  for (size_t i = 0; i < inputs.size(); ++i)
    for (int32_t id : inputs[i])
      if (id < 0 || id >= V) fail("{}: token id {} is outside the model's vocabulary (0..{})", o.files[i], id, V - 1);
  names = o.files;
  return inputs;
}

// Windows (window mode) or truncated streams (stream mode).
std::vector<eval::Ids> cut_work(const PplOpts& o, const std::vector<eval::Ids>& inputs,
                                const std::vector<std::string>& names, const ModelConfig& cfg) {
  std::vector<eval::Ids> work;
  if (o.stream > 0) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& s = inputs[i];
      if (s.size() < 2) fail("{}: {} token(s), expected >= 2 for stream mode", names[i], s.size());
      work.emplace_back(s.begin(), s.begin() + std::min<int64_t>(int64_t(s.size()), o.stream));
      if (int64_t(s.size()) < o.stream && !o.quiet)
        fmt::print(stderr, "note: {} has {} tokens, fewer than --stream {}\n", names[i], s.size(), o.stream);
    }
    return work;
  }
  // Text files form one stream; an ids file keeps its arrays apart.
  work = o.ids_file.empty() ? eval::cut_windows({eval::concatenate(inputs)}, o.window, o.max_windows)
                            : eval::cut_windows(inputs, o.window, o.max_windows);
  if (work.empty()) {
    size_t longest = 0;
    for (const auto& s : inputs) longest = std::max(longest, s.size());
    fail("the input has {} tokens{}, fewer than one --window of {}",
         o.ids_file.empty() ? eval::concatenate(inputs).size() : longest,
         o.ids_file.empty() ? "" : " in its longest array", o.window);
  }
  if (o.window > cfg.max_position && !o.quiet)
    fmt::print(stderr, "note: --window {} is longer than the model's context of {} tokens\n", o.window,
               cfg.max_position);
  return work;
}

std::vector<Row> score_all(const PplOpts& o, const Model& model, const std::vector<eval::Ids>& work,
                           const std::vector<CacheSpec>& settings, bool do_full, bool do_cache) {
  int64_t per_pass = 0;
  for (const auto& w : work) per_pass += int64_t(w.size()) - 1;
  const std::vector<std::string> labels = spec_labels(settings);
  std::vector<Row> rows;
  for (size_t i = 0; i < settings.size(); ++i) {
    Row row{settings[i], labels[i], {}, {}};
    if (do_full) {
      eval::Progress bar(row.label + " · full forward", per_pass, !o.quiet);
      row.full = eval::score_windows(model, work, eval::Path::Full, row.spec, [&](int64_t n) { bar.add(n); }, o.bin);
    }
    if (do_cache) {
      eval::Progress bar(row.label + " · through cache", per_pass, !o.quiet);
      auto prog = [&](int64_t n) { bar.add(n); };
      row.cache = o.stream > 0 ? eval::score_streams(model, work, row.spec, prog, o.bin)
                               : eval::score_windows(model, work, eval::Path::Cache, row.spec, prog, o.bin);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

eval::Table stream_table(const std::vector<Row>& rows) {
  eval::Table table;
  size_t n_segments = 0;
  for (const auto& r : rows) n_segments = std::max(n_segments, r.cache.segments.size());
  table.header = {"setting"};
  for (size_t i = 0; i < n_segments; ++i) table.header.push_back("ppl " + eval::Segments::label(int64_t(i)));
  for (const char* h : {"overall", "predictions", "max stored", "cache bytes", "tok/s"}) table.header.push_back(h);
  for (const auto& r : rows) {
    std::vector<std::string> cells = {r.label};
    for (size_t i = 0; i < n_segments; ++i)
      cells.push_back(i < r.cache.segments.size() ? fmt_ppl(r.cache.segments[i].ppl()) : "");
    cells.push_back(fmt_ppl(r.cache.total.ppl()));
    cells.push_back(fmt::format("{}", r.cache.total.count));
    cells.push_back(fmt::format("{}", r.cache.max_stored));
    cells.push_back(fmt_bytes(r.cache.max_cache_bytes));
    cells.push_back(fmt::format("{:.0f}", r.cache.tokens_per_second()));
    table.rows.push_back(std::move(cells));
  }
  return table;
}

eval::Table window_table(const std::vector<Row>& rows, size_t n_windows, bool do_full, bool do_cache) {
  eval::Table table;
  table.header = {"setting", "windows", "predictions"};
  if (do_full) table.header.insert(table.header.end(), {"ppl full forward", "full tok/s"});
  if (do_cache) table.header.insert(table.header.end(), {"ppl through cache", "cache tok/s", "cache bytes"});
  if (do_full && do_cache) table.header.push_back("cache / full − 1");
  for (const auto& r : rows) {
    const auto& any = do_full ? r.full : r.cache;
    std::vector<std::string> cells = {r.label, fmt::format("{}", n_windows), fmt::format("{}", any.total.count)};
    if (do_full) {
      cells.push_back(fmt_ppl(r.full.total.ppl()));
      cells.push_back(fmt::format("{:.0f}", r.full.tokens_per_second()));
    }
    if (do_cache) {
      cells.push_back(fmt_ppl(r.cache.total.ppl()));
      cells.push_back(fmt::format("{:.0f}", r.cache.tokens_per_second()));
      cells.push_back(fmt_bytes(r.cache.max_cache_bytes));
    }
    if (do_full && do_cache) cells.push_back(fmt::format("{:+.2e}", r.cache.total.ppl() / r.full.total.ppl() - 1.0));
    table.rows.push_back(std::move(cells));
  }
  return table;
}

// Perplexity per bin of positions, one line per setting (and path).
void write_plot(const PplOpts& o, const std::vector<Row>& rows, size_t n_inputs, bool do_full, bool do_cache) {
  std::vector<eval::Series> series;
  auto add_series = [&](const std::string& name, const eval::RunResult& r) {
    eval::Series s{name, {}};
    for (size_t i = 0; i < r.bins.size(); ++i)
      if (r.bins[i].count) s.points.emplace_back((double(i) + 0.5) * double(r.bin_size), r.bins[i].ppl());
    series.push_back(std::move(s));
  };
  for (const auto& r : rows) {
    if (do_full) add_series(r.label + (do_cache ? " · full" : ""), r.full);
    if (do_cache) add_series(r.label + (do_full ? " · cache" : ""), r.cache);
  }
  const bool stream_mode = o.stream > 0;
  eval::PlotSpec spec;
  spec.title = fmt::format("{} — perplexity by {} ({} inputs, {} positions per point)", o.model,
                           stream_mode ? "stream position" : "position in window", n_inputs, o.bin);
  spec.x_label = stream_mode ? "predicted-token position in the stream" : "predicted-token position in the window";
  spec.y_label = "perplexity";
  eval::write_file(o.plot, eval::svg_line_plot(series, spec));
  if (!o.quiet) fmt::print(stderr, "wrote {}\n", o.plot);
}

nlohmann::json results_json(const PplOpts& o, const std::vector<Row>& rows, const std::vector<std::string>& names,
                            size_t n_windows, bool do_full, bool do_cache) {
  nlohmann::json j = {{"model", o.model}, {"mode", o.stream > 0 ? "stream" : "window"}, {"inputs", names}};
  if (o.stream > 0) j["stream"] = o.stream;
  else {
    j["window"] = o.window;
    j["windows"] = n_windows;
  }
  j["results"] = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json e = {{"label", r.label}, {"kv_cache", r.spec.to_json()}};
    if (do_full) e["full_forward"] = run_json(r.full);
    if (do_cache) e["through_cache"] = run_json(r.cache);
    j["results"].push_back(e);
  }
  return j;
}

void run_perplexity(const PplOpts& o) {
  check_options(o);
  const std::vector<CacheSpec> settings = eval::expand_sweep(o.sweep);
  apply_threads(o.threads);
  LoadedModel lm = load_model(o.model);
  const DeviceGuard device = apply_device(*lm.model, o.device);
  std::vector<std::string> names;
  const std::vector<eval::Ids> inputs = read_inputs(o, lm, names);
  const std::vector<eval::Ids> work = cut_work(o, inputs, names, lm.model->config());
  const bool stream_mode = o.stream > 0;
  const bool do_full = !stream_mode && !o.cache_only;
  const bool do_cache = stream_mode || o.through_cache || o.cache_only;
  const std::vector<Row> rows = score_all(o, *lm.model, work, settings, do_full, do_cache);
  if (!o.plot.empty()) write_plot(o, rows, work.size(), do_full, do_cache);
  const eval::Table table = stream_mode ? stream_table(rows) : window_table(rows, work.size(), do_full, do_cache);
  if (o.json) {
    fmt::print("{}\n", results_json(o, rows, names, work.size(), do_full, do_cache).dump(2));
  } else if (o.csv) {
    fmt::print("{}", table.csv());
  } else {
    if (stream_mode)
      fmt::print("stream mode: {} input(s), first {} tokens each, fed token by token through the cache\n\n",
                 work.size(), o.stream);
    else
      fmt::print("window mode: {} window(s) of {} tokens, each scored on {} next-token predictions\n\n",
                 work.size(), o.window, o.window - 1);
    fmt::print("{}", table.markdown());
  }
}

}  // namespace

void add_perplexity_command(CLI::App& root) {
  auto o = std::make_shared<PplOpts>();
  CLI::App* cmd = root.add_subcommand(
      "perplexity",
      "Perplexity over text files or token ids: fixed windows (full forward and/or through the KV cache) or long "
      "streams through a bounded cache (--stream)");
  cmd->add_option("model", o->model, "Model folder")->required();
  cmd->add_option("files", o->files,
                  "Text files; the input stream is BOS, file, EOS for each file in order (window mode joins them)");
  cmd->add_option("--ids-file", o->ids_file,
                  "JSON array of arrays of token ids, used as given (window mode: each array cut into its own "
                  "windows; stream mode: each array one stream)");
  cmd->add_option("--window,-w", o->window, "Window length in tokens (window mode; default 512)");
  cmd->add_option("--max-windows,-k", o->max_windows, "Score at most K windows (default 0 = all)");
  cmd->add_option("--stream", o->stream,
                  "Stream mode: feed the first N tokens of each input token by token through the cache, with "
                  "eviction; report perplexity per position segment (1–511, 512–1023, 1024–2047, ...)");
  cmd->add_flag("--through-cache", o->through_cache,
                "Window mode: also score each window token by token through the cache (the decode path of "
                "`sample`) and compare with the full forward");
  cmd->add_flag("--cache-only", o->cache_only, "Window mode: score only through the cache (skip the full forward)");
  add_sweep_flags(cmd, o->sweep, "fp32");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--csv", o->csv, "Print the table as CSV");
  cmd->add_option("--plot", o->plot, "Write an SVG plot of perplexity against position, one line per setting");
  cmd->add_option("--plot-bin", o->bin, "Positions per plotted point (default 128)");
  cmd->add_flag("--quiet,-q", o->quiet, "No progress bar");
  add_threads_flag(cmd, o->threads);
  add_device_flags(cmd, o->device);
  cmd->callback([o] { run_perplexity(*o); });
}

}  // namespace ptllm::cli
