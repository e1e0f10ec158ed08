// `compare`: greedy decoding under each cache setting against the plain fp32
// cache — how many leading tokens match, per prompt and on average.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "eval/perplexity.h"
#include "eval/report.h"
#include "eval/sweep.h"
#include "io/mmap.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {
namespace {

// Prompts from a file: a JSON array of strings, a JSON object whose "prompts"
// array holds strings or {"prompt": ...} objects (a reference.json), or plain
// text with one prompt per non-empty line.
std::vector<std::string> read_prompts(const std::string& path) {
  const std::string text = read_text_file(path);
  std::vector<std::string> out;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '[' || text[first] == '{')) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", path, e.what());
    }
    const nlohmann::json* arr = &j;
    if (j.is_object()) {
      if (!j.contains("prompts")) fail("{}: expected a \"prompts\" array", path);
      arr = &j["prompts"];
    }
    if (!arr->is_array()) fail("{}: expected an array of prompts", path);
    for (const auto& p : *arr) {
      if (p.is_string()) out.push_back(p.get<std::string>());
      else if (p.is_object() && p.contains("prompt") && p["prompt"].is_string()) out.push_back(p["prompt"]);
      else fail("{}: expected each prompt to be a string or an object with a \"prompt\" string", path);
    }
  } else {
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::string line = text.substr(pos, nl - pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") != std::string::npos) out.push_back(line);
      pos = nl + 1;
    }
  }
  if (out.empty()) fail("{}: no prompts found", path);
  return out;
}

struct CompareOpts {
  std::string model, prompts;
  int64_t tokens = 60;
  bool json = false, csv = false, quiet = false;
  eval::SweepFlags sweep;
  int threads = 0;
  WeightOpts weights;  // --weights, --mmap
};

eval::Table match_table(const std::vector<std::string>& prompts, const std::vector<std::string>& labels,
                        const eval::GreedyMatch& g) {
  eval::Table table;
  table.header = {"prompt"};
  for (const auto& l : labels) table.header.push_back(l);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<std::string> cells = {prompts[i]};
    for (size_t s = 0; s < labels.size(); ++s) cells.push_back(fmt::format("{}/{}", g.match[i][s], g.reference[i].size()));
    table.rows.push_back(std::move(cells));
  }
  std::vector<std::string> last = {"mean"};
  for (double m : g.mean_fraction) last.push_back(fmt::format("{:.1f}%", 100 * m));
  table.rows.push_back(last);
  return table;
}

nlohmann::json match_json(const CompareOpts& o, const std::vector<std::string>& prompts,
                          const std::vector<eval::Ids>& prompt_ids, const std::vector<CacheSpec>& settings,
                          const std::vector<std::string>& labels, const eval::GreedyMatch& g) {
  nlohmann::json j = {{"model", o.model}, {"tokens", o.tokens}, {"reference", "fp32 cache, unbounded"}};
  j["prompts"] = nlohmann::json::array();
  for (size_t i = 0; i < prompts.size(); ++i)
    j["prompts"].push_back({{"prompt", prompts[i]}, {"prompt_ids", prompt_ids[i]}, {"fp32_ids", g.reference[i]}});
  j["settings"] = nlohmann::json::array();
  for (size_t s = 0; s < settings.size(); ++s) {
    nlohmann::json e = {{"label", labels[s]}, {"kv_cache", settings[s].to_json()}, {"mean_match_fraction", g.mean_fraction[s]}};
    nlohmann::json per = nlohmann::json::array();
    for (size_t i = 0; i < prompts.size(); ++i)
      per.push_back({{"prefix_match", g.match[i][s]}, {"tokens", g.reference[i].size()}, {"ids", g.outputs[s][i]}});
    e["per_prompt"] = per;
    j["settings"].push_back(e);
  }
  return j;
}

void run_compare(CompareOpts& o) {
  if (o.json && o.csv) fail("--json and --csv: choose one output format");
  if (o.tokens < 1) fail("--tokens {}: expected >= 1", o.tokens);
  if (o.sweep.kv_quantize.empty()) o.sweep.kv_quantize = "bf16,int8,int4";
  const std::vector<CacheSpec> settings = eval::expand_sweep(o.sweep);
  const std::vector<std::string> labels = spec_labels(settings);
  const std::vector<std::string> prompts = read_prompts(o.prompts);
  apply_threads(o.threads);
  LoadedModel lm = load_model_opts(o.model, o.weights);
  std::vector<eval::Ids> prompt_ids;
  for (const auto& p : prompts) prompt_ids.push_back(encode_prompt(lm, p, /*add_bos=*/true));
  eval::Progress bar("greedy decoding", int64_t(prompts.size() * (settings.size() + 1)) * o.tokens, !o.quiet);
  const eval::GreedyMatch g = eval::compare_greedy(lm, prompt_ids, settings, o.tokens, [&](int64_t n) { bar.add(n); });
  bar.finish();
  const eval::Table table = match_table(prompts, labels, g);
  if (o.json) {
    fmt::print("{}\n", match_json(o, prompts, prompt_ids, settings, labels, g).dump(2));
  } else if (o.csv) {
    fmt::print("{}", table.csv());
  } else {
    fmt::print("greedy prefix match against the fp32 cache, {} tokens per prompt\n\n", o.tokens);
    fmt::print("{}", table.markdown());
  }
}

}  // namespace

void add_compare_command(CLI::App& root) {
  auto o = std::make_shared<CompareOpts>();
  CLI::App* cmd = root.add_subcommand(
      "compare", "Greedy decoding under each cache setting vs the fp32 cache: matching prefix per prompt and mean");
  cmd->add_option("model", o->model, "Model folder")->required();
  cmd->add_option("--prompts", o->prompts,
                  "Prompts: one per line, a JSON array of strings, or a reference.json with a \"prompts\" array")
      ->required();
  cmd->add_option("--tokens,-n", o->tokens, "Greedy tokens per prompt (default 60)");
  add_sweep_flags(cmd, o->sweep, "bf16,int8,int4");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->add_flag("--csv", o->csv, "Print the table as CSV");
  cmd->add_flag("--quiet,-q", o->quiet, "No progress bar");
  add_threads_flag(cmd, o->threads);
  add_weights_flag(cmd, o->weights);
  cmd->callback([o] { run_compare(*o); });
}

}  // namespace ptllm::cli
