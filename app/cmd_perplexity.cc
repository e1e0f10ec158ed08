// `perplexity`: how well a model predicts text, by full forward or through the
// KV cache (any cache settings, several in one run), in fixed windows or as
// long streams with eviction. Markdown table by default; --json / --csv; --plot
// writes an SVG of perplexity against stream position. --llama-cpp scores as
// llama-perplexity does; --kl-divergence compares every setting's next-token
// distributions with the fp32 cache's on the same inputs.
#include <fmt/core.h>

#include <algorithm>
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
std::string fmt_kl(double k) { return std::isfinite(k) ? fmt::format("{:.3e}", k) : "n/a"; }
std::string fmt_share(double f) { return std::isfinite(f) ? fmt::format("{:.2f}%", 100.0 * f) : "n/a"; }
std::string fmt_bytes(size_t b) {
  if (b >= (size_t(1) << 20)) return fmt::format("{:.2f} MiB", double(b) / double(1 << 20));
  if (b >= 1024) return fmt::format("{:.1f} KiB", double(b) / 1024.0);
  return fmt::format("{} B", b);
}

nlohmann::json run_json(const eval::RunResult& r, const std::string& kl_ref_label) {
  nlohmann::json j = {{"ppl", r.total.ppl()},
                      {"mean_nll", r.total.mean_nll()},
                      {"predictions", r.total.count},
                      {"tokens_fed", r.tokens_fed},
                      {"seconds", r.seconds},
                      {"tokens_per_second", r.tokens_per_second()},
                      {"max_stored_tokens", r.max_stored},
                      {"max_cache_bytes", r.max_cache_bytes},
                      {"cache", r.cache}};
  if (r.has_kl)
    j["kl_divergence"] = {{"reference", kl_ref_label},
                          {"mean", r.total.mean_kl()},
                          {"median", r.kl.quantile(0.5)},
                          {"p99", r.kl.quantile(0.99)},
                          {"max", r.kl.quantile(1.0)},
                          {"top1_agreement", r.total.top1_agreement()},
                          {"predictions", r.total.count}};
  // Per segment / bin: perplexity, and in a KL run mean KL and top-1 agreement.
  auto tally = [&](int64_t first, int64_t last, const eval::Tally& t) {
    nlohmann::json e = {{"first", first}, {"last", last}, {"predictions", t.count}, {"ppl", t.ppl()}};
    if (r.has_kl) {
      e["kl_mean"] = t.mean_kl();
      e["top1_agreement"] = t.top1_agreement();
    }
    return e;
  };
  nlohmann::json segs = nlohmann::json::array();
  for (size_t i = 0; i < r.segments.size(); ++i)
    if (r.segments[i].count)
      segs.push_back(tally(eval::Segments::first(int64_t(i)), eval::Segments::last(int64_t(i)), r.segments[i]));
  j["segments"] = segs;
  nlohmann::json bins = nlohmann::json::array();
  for (size_t i = 0; i < r.bins.size(); ++i)
    if (r.bins[i].count)
      bins.push_back(tally(int64_t(i) * r.bin_size, (int64_t(i) + 1) * r.bin_size - 1, r.bins[i]));
  j["bins"] = bins;
  return j;
}

struct PplOpts {
  std::string model, ids_file, plot;
  std::vector<std::string> files;
  int64_t window = 512, max_windows = 0, stream = 0, bin = 128;
  bool through_cache = false, cache_only = false, json = false, csv = false, quiet = false;
  bool llama_cpp = false, kl = false;
  eval::SweepFlags sweep;
  int threads = 0;
  WeightOpts weights;  // --weights, --mmap
  DeviceOpts device;
};

// One result row: a cache setting and its runs.
struct Row {
  CacheSpec spec;
  std::string label;
  eval::RunResult full, cache;
  std::string kl_ref;  // label of the setting the KL is measured against (KL runs)
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
  if (o.llama_cpp && o.stream > 0) fail("--llama-cpp: scores fixed chunks (window mode); drop --stream");
  if (o.llama_cpp && o.window < 4) fail("--window {}: expected >= 4 for --llama-cpp", o.window);
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
  if (o.llama_cpp) {
    // llama-perplexity: the texts joined and tokenized once, BOS first (if the model adds one).
    auto joined = eval::tokenize_joined(o.files, *lm.tokenizer, lm.add_bos ? lm.bos_id : -1);
    for (int32_t id : joined)
      if (id < 0 || id >= V) fail("token id {} is outside the model's vocabulary (0..{})", id, V - 1);
    names = o.files;
    return {std::move(joined)};
  }
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
                                const std::vector<std::string>& names, const ModelConfig& cfg, int32_t bos) {
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
  if (o.llama_cpp) {
    // One stream (an ids file's arrays joined, used as given), each chunk's first token -> BOS.
    work = eval::cut_llama_cpp_chunks(eval::concatenate(inputs), o.window, o.max_windows, bos);
  } else {
    // Text files form one stream; an ids file keeps its arrays apart.
    work = o.ids_file.empty() ? eval::cut_windows({eval::concatenate(inputs)}, o.window, o.max_windows)
                              : eval::cut_windows(inputs, o.window, o.max_windows);
  }
  if (work.empty()) {
    size_t longest = 0;
    for (const auto& s : inputs) longest = std::max(longest, s.size());
    const bool joined = o.ids_file.empty() || o.llama_cpp;
    fail("the input has {} tokens{}, fewer than one --window of {}",
         joined ? eval::concatenate(inputs).size() : longest, joined ? "" : " in its longest array", o.window);
  }
  if (o.window > cfg.max_position && !o.quiet)
    fmt::print(stderr, "note: --window {} is longer than the model's context of {} tokens\n", o.window,
               cfg.max_position);
  return work;
}

eval::ScoreOptions score_options(const PplOpts& o, eval::Progress* bar) {
  eval::ScoreOptions so;
  if (bar) so.progress = [bar](int64_t n) { bar->add(n); };
  so.bin_size = o.bin;
  so.first_scored = o.llama_cpp ? eval::llama_cpp_first_scored(o.window) : 1;
  return so;
}

std::vector<Row> score_all(const PplOpts& o, const Model& model, const std::vector<eval::Ids>& work,
                           const std::vector<CacheSpec>& settings, bool do_full, bool do_cache) {
  int64_t per_pass = 0;
  for (const auto& w : work) per_pass += int64_t(w.size()) - 1;
  const std::vector<std::string> labels = spec_labels(settings);
  std::vector<Row> rows;
  for (size_t i = 0; i < settings.size(); ++i) rows.push_back(Row{settings[i], labels[i], {}, {}, {}});
  if (!o.kl) {
    for (Row& row : rows) {
      if (do_full) {
        eval::Progress bar(row.label + " · full forward", per_pass, !o.quiet);
        row.full = eval::score_windows(model, work, eval::Path::Full, row.spec, score_options(o, &bar));
      }
      if (do_cache) {
        eval::Progress bar(row.label + " · through cache", per_pass, !o.quiet);
        row.cache = o.stream > 0 ? eval::score_streams(model, work, row.spec, score_options(o, &bar))
                                 : eval::score_windows(model, work, eval::Path::Cache, row.spec, score_options(o, &bar));
      }
    }
    return rows;
  }
  // KL runs: the settings grouped by their fp32 reference (the same eviction),
  // each group run in lockstep with its reference; a setting equal to its
  // reference takes the reference's own row (KL 0 against itself).
  std::vector<bool> done(rows.size(), false);
  for (size_t g = 0; g < rows.size(); ++g) {
    if (done[g]) continue;
    const CacheSpec ref = eval::kl_reference(rows[g].spec);
    std::vector<size_t> members, runs;  // rows of this group; rows that need their own cache
    for (size_t i = g; i < rows.size(); ++i)
      if (!done[i] && eval::kl_reference(rows[i].spec) == ref) {
        members.push_back(i);
        done[i] = true;
        if (!(rows[i].spec == ref)) runs.push_back(i);
      }
    std::vector<CacheSpec> specs;
    for (size_t i : runs) specs.push_back(rows[i].spec);
    const std::string ref_label = ref.label();
    const std::string what = fmt::format("KL vs {} ({} setting{})", ref_label, members.size(), members.size() == 1 ? "" : "s");
    auto place = [&](const eval::KlRun& kr, eval::RunResult Row::*slot) {
      for (size_t i : members) rows[i].kl_ref = ref_label;
      for (size_t k = 0; k < runs.size(); ++k) rows[runs[k]].*slot = kr.settings[k];
      for (size_t i : members)
        if (rows[i].spec == ref) rows[i].*slot = kr.reference;
    };
    if (do_full) {
      eval::Progress bar(what + " · full forward", per_pass, !o.quiet);
      place(eval::score_windows_kl(model, work, eval::Path::Full, ref, specs, score_options(o, &bar)), &Row::full);
    }
    if (do_cache) {
      eval::Progress bar(what + " · through cache", per_pass, !o.quiet);
      place(o.stream > 0 ? eval::score_streams_kl(model, work, ref, specs, score_options(o, &bar))
                         : eval::score_windows_kl(model, work, eval::Path::Cache, ref, specs, score_options(o, &bar)),
            &Row::cache);
    }
  }
  return rows;
}

// KL columns of one run: mean, median, p99, max KL and top-1 agreement.
void kl_header(std::vector<std::string>& h, const std::string& prefix) {
  for (const char* c : {"mean KLD", "median KLD", "p99 KLD", "max KLD", "same top-1"}) h.push_back(prefix + c);
}
void kl_cells(std::vector<std::string>& cells, const eval::RunResult& r) {
  cells.push_back(fmt_kl(r.total.mean_kl()));
  cells.push_back(fmt_kl(r.kl.quantile(0.5)));
  cells.push_back(fmt_kl(r.kl.quantile(0.99)));
  cells.push_back(fmt_kl(r.kl.quantile(1.0)));
  cells.push_back(fmt_share(r.total.top1_agreement()));
}

eval::Table stream_table(const std::vector<Row>& rows, bool kl) {
  eval::Table table;
  size_t n_segments = 0;
  for (const auto& r : rows) n_segments = std::max(n_segments, r.cache.segments.size());
  table.header = {"setting"};
  for (size_t i = 0; i < n_segments; ++i) table.header.push_back("ppl " + eval::Segments::label(int64_t(i)));
  table.header.push_back("overall");
  if (kl) kl_header(table.header, "");
  for (const char* h : {"predictions", "max stored", "cache bytes", "tok/s"}) table.header.push_back(h);
  for (const auto& r : rows) {
    std::vector<std::string> cells = {r.label};
    for (size_t i = 0; i < n_segments; ++i)
      cells.push_back(i < r.cache.segments.size() ? fmt_ppl(r.cache.segments[i].ppl()) : "");
    cells.push_back(fmt_ppl(r.cache.total.ppl()));
    if (kl) kl_cells(cells, r.cache);
    cells.push_back(fmt::format("{}", r.cache.total.count));
    cells.push_back(fmt::format("{}", r.cache.max_stored));
    cells.push_back(fmt_bytes(r.cache.max_cache_bytes));
    cells.push_back(fmt::format("{:.0f}", r.cache.tokens_per_second()));
    table.rows.push_back(std::move(cells));
  }
  return table;
}

eval::Table window_table(const std::vector<Row>& rows, size_t n_windows, bool do_full, bool do_cache, bool kl) {
  eval::Table table;
  table.header = {"setting", "windows", "predictions"};
  if (do_full) table.header.insert(table.header.end(), {"ppl full forward", "full tok/s"});
  if (do_full && kl) kl_header(table.header, do_cache ? "full " : "");
  if (do_cache) table.header.insert(table.header.end(), {"ppl through cache", "cache tok/s", "cache bytes"});
  if (do_cache && kl) kl_header(table.header, do_full ? "cache " : "");
  if (do_full && do_cache) table.header.push_back("cache / full − 1");
  for (const auto& r : rows) {
    const auto& any = do_full ? r.full : r.cache;
    std::vector<std::string> cells = {r.label, fmt::format("{}", n_windows), fmt::format("{}", any.total.count)};
    if (do_full) {
      cells.push_back(fmt_ppl(r.full.total.ppl()));
      cells.push_back(fmt::format("{:.0f}", r.full.tokens_per_second()));
      if (kl) kl_cells(cells, r.full);
    }
    if (do_cache) {
      cells.push_back(fmt_ppl(r.cache.total.ppl()));
      cells.push_back(fmt::format("{:.0f}", r.cache.tokens_per_second()));
      cells.push_back(fmt_bytes(r.cache.max_cache_bytes));
      if (kl) kl_cells(cells, r.cache);
    }
    if (do_full && do_cache) cells.push_back(fmt::format("{:+.2e}", r.cache.total.ppl() / r.full.total.ppl() - 1.0));
    table.rows.push_back(std::move(cells));
  }
  return table;
}

// "a/b.svg" -> "a/b-kl.svg" (the KL plot beside the perplexity plot).
std::string kl_plot_path(const std::string& path) {
  const auto dot = path.rfind('.'), slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + "-kl";
  return path.substr(0, dot) + "-kl" + path.substr(dot);
}

// Perplexity per bin of positions, one line per setting (and path); in a KL
// run also mean KL per bin (a second SVG, kl_plot_path).
void write_plot(const PplOpts& o, const std::vector<Row>& rows, size_t n_inputs, bool do_full, bool do_cache) {
  const bool stream_mode = o.stream > 0;
  auto plot = [&](const std::string& path, const char* what, const char* y_label, auto value) {
    std::vector<eval::Series> series;
    auto add_series = [&](const std::string& name, const eval::RunResult& r) {
      eval::Series s{name, {}};
      for (size_t i = 0; i < r.bins.size(); ++i)
        if (r.bins[i].count) s.points.emplace_back((double(i) + 0.5) * double(r.bin_size), value(r.bins[i]));
      series.push_back(std::move(s));
    };
    for (const auto& r : rows) {
      if (do_full) add_series(r.label + (do_cache ? " · full" : ""), r.full);
      if (do_cache) add_series(r.label + (do_full ? " · cache" : ""), r.cache);
    }
    eval::PlotSpec spec;
    spec.title = fmt::format("{} — {} by {} ({} inputs, {} positions per point)", o.model, what,
                             stream_mode ? "stream position" : "position in window", n_inputs, o.bin);
    spec.x_label = stream_mode ? "predicted-token position in the stream" : "predicted-token position in the window";
    spec.y_label = y_label;
    eval::write_file(path, eval::svg_line_plot(series, spec));
    if (!o.quiet) fmt::print(stderr, "wrote {}\n", path);
  };
  plot(o.plot, "perplexity", "perplexity", [](const eval::Tally& t) { return t.ppl(); });
  if (o.kl)
    // The fp32 reference's own line is 0 everywhere: skipped on the log axis, so only the settings show.
    plot(kl_plot_path(o.plot), "mean KL divergence vs fp32", "mean KL divergence (nats)",
         [](const eval::Tally& t) { return t.mean_kl(); });
}

nlohmann::json results_json(const PplOpts& o, const std::vector<Row>& rows, const std::vector<std::string>& names,
                            size_t n_windows, bool do_full, bool do_cache) {
  nlohmann::json j = {{"model", o.model}, {"mode", o.stream > 0 ? "stream" : "window"}, {"inputs", names}};
  if (o.stream > 0) j["stream"] = o.stream;
  else {
    j["window"] = o.window;
    j["windows"] = n_windows;
  }
  if (o.llama_cpp) {
    j["protocol"] = "llama.cpp";
    j["first_scored_position"] = eval::llama_cpp_first_scored(o.window);
  }
  j["results"] = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json e = {{"label", r.label}, {"kv_cache", r.spec.to_json()}};
    if (do_full) e["full_forward"] = run_json(r.full, r.kl_ref);
    if (do_cache) e["through_cache"] = run_json(r.cache, r.kl_ref);
    j["results"].push_back(e);
  }
  return j;
}

// KL runs: each setting's fp32 reference joins the rows (before the first
// setting it is the reference of) when the sweep does not already hold it.
std::vector<CacheSpec> with_references(const std::vector<CacheSpec>& settings) {
  std::vector<CacheSpec> out;
  for (const CacheSpec& s : settings) {
    const CacheSpec ref = eval::kl_reference(s);
    if (std::find(settings.begin(), settings.end(), ref) == settings.end() &&
        std::find(out.begin(), out.end(), ref) == out.end())
      out.push_back(ref);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

void run_perplexity(const PplOpts& o) {
  check_options(o);
  std::vector<CacheSpec> settings = eval::expand_sweep(o.sweep);
  if (o.kl) settings = with_references(settings);
  apply_threads(o.threads);
  LoadedModel lm = load_model_opts(o.model, o.weights);
  const DeviceGuard device = apply_device(*lm.model, o.device);
  std::vector<std::string> names;
  const std::vector<eval::Ids> inputs = read_inputs(o, lm, names);
  const std::vector<eval::Ids> work =
      cut_work(o, inputs, names, lm.model->config(), lm.add_bos ? lm.bos_id : int32_t(-1));
  const bool stream_mode = o.stream > 0;
  const bool do_full = !stream_mode && !o.cache_only;
  const bool do_cache = stream_mode || o.through_cache || o.cache_only;
  const std::vector<Row> rows = score_all(o, *lm.model, work, settings, do_full, do_cache);
  if (!o.plot.empty()) write_plot(o, rows, work.size(), do_full, do_cache);
  const eval::Table table =
      stream_mode ? stream_table(rows, o.kl) : window_table(rows, work.size(), do_full, do_cache, o.kl);
  if (o.json) {
    fmt::print("{}\n", results_json(o, rows, names, work.size(), do_full, do_cache).dump(2));
  } else if (o.csv) {
    fmt::print("{}", table.csv());
  } else {
    if (stream_mode)
      fmt::print("stream mode: {} input(s), first {} tokens each, fed token by token through the cache\n\n",
                 work.size(), o.stream);
    else if (o.llama_cpp)
      fmt::print("llama.cpp protocol: {} chunk(s) of {} tokens (one stream tokenized with BOS first, each chunk's "
                 "first token replaced by BOS), each scored on its second half: {} next-token predictions\n\n",
                 work.size(), o.window, o.window - eval::llama_cpp_first_scored(o.window));
    else
      fmt::print("window mode: {} window(s) of {} tokens, each scored on {} next-token predictions\n\n",
                 work.size(), o.window, o.window - 1);
    if (o.kl)
      fmt::print("KL divergence: KL(P_fp32 || P_setting) in nats per scored prediction, against the fp32 cache with "
                 "the same eviction on the same inputs; same top-1 = share of predictions whose most likely token "
                 "is the fp32 cache's\n\n");
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
  cmd->add_option("--window,-w,--ctx", o->window, "Window length in tokens (window mode; default 512)");
  cmd->add_option("--max-windows,-k,--chunks", o->max_windows, "Score at most K windows (default 0 = all)");
  cmd->add_flag("--llama-cpp", o->llama_cpp,
                "Score as llama-perplexity does: the text files joined and tokenized once with BOS first, cut into "
                "consecutive --window chunks, each chunk's first token replaced by BOS, only the second half of "
                "each chunk scored (--ctx/--chunks are aliases of --window/--max-windows)");
  cmd->add_flag("--kl-divergence", o->kl,
                "Also compare every setting's next-token distributions with the fp32 cache's (the same eviction, "
                "run in lockstep on the same inputs): mean / median / p99 / max KL divergence and the share of "
                "predictions with the same top-1 token (the fp32 reference is added as a row)");
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
  add_weights_flag(cmd, o->weights);
  add_device_flags(cmd, o->device);
  cmd->callback([o] { run_perplexity(*o); });
}

}  // namespace ptllm::cli
