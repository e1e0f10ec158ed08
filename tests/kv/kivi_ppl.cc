// kivi_ppl: perplexity of one cache setting with the KIVI knobs the
// `perplexity` command does not expose (--kivi-group, --kivi-residual, K/V
// storage apart), through the same eval library (same windows, same scoring).
// Used by scripts/kivi_eval.sh to compare the simple and grouped schemes.
//
//   kivi_ppl MODEL window|stream N K V GROUP RESIDUAL SINK WINDOW FILE...
//     window: N windows of 512 tokens, token by token through the cache
//     stream: the first N tokens of each file through the cache
//     K, V: fp32|fp16|bf16|int8|int4|int2; SINK/WINDOW 0 0 = unbounded
//     FILE arguments of the form field=value (a CacheSpec JSON field, e.g.
//     residual_dtype=fp32) set that field instead.
#include <fmt/core.h>

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "engine/session.h"
#include "eval/perplexity.h"

using namespace ptllm;

int main(int argc, char** argv) try {
  if (argc < 11) {
    fmt::print(stderr, "usage: kivi_ppl MODEL window|stream N K V GROUP RESIDUAL SINK WINDOW FILE...\n");
    return 2;
  }
  const std::string mode = argv[2];
  const int64_t n = std::atoll(argv[3]);
  CacheSpec o;
  const char* fields[] = {"quantize_k", "quantize_v", "kivi_group", "kivi_residual", "sink", "window"};
  for (int i = 0; i < 6; ++i)
    if (auto issue = o.set(fields[i], argv[4 + i])) throw CacheSpecError(*issue);
  std::vector<std::string> files;
  for (int i = 10; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    if (eq == std::string::npos || a.find('/') < eq) {
      files.push_back(a);
    } else if (auto issue = o.set(a.substr(0, eq), a.substr(eq + 1))) {
      throw CacheSpecError(*issue);
    }
  }
  o.check();
  LoadedModel lm = load_model(argv[1]);
  const int32_t eos = lm.eos_ids.empty() ? -1 : lm.eos_ids[0];
  auto inputs = eval::tokenize_files(files, *lm.tokenizer, lm.bos_id, eos);
  std::vector<eval::Ids> work;
  if (mode == "stream") {
    for (auto& s : inputs) work.emplace_back(s.begin(), s.begin() + std::min<int64_t>(int64_t(s.size()), n));
  } else {
    work = eval::cut_windows({eval::concatenate(inputs)}, 512, n);
  }
  const auto r = mode == "stream" ? eval::score_streams(*lm.model, work, o)
                                  : eval::score_windows(*lm.model, work, eval::Path::Cache, o);
  fmt::print("{}\tppl {:.4f}\tpredictions {}\tmax_cache_bytes {}\t{:.1f} tok/s\n", o.describe(), r.total.ppl(),
             r.total.count, r.max_cache_bytes, r.tokens_per_second());
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kivi_ppl: {}\n", e.what());
  return 1;
}
