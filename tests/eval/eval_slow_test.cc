// flagship-27m perplexity over the held-out books against transformers: 64
// full-forward windows, heavy, so labelled "slow" (the Release pass runs it,
// the sanitizer pass leaves it out).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/session.h"
#include "eval/perplexity.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ptllm {
namespace {
namespace fs = std::filesystem;
using eval::Ids;

const std::string kFlagship = test::repo_dir() + "/models/flagship-27m";

std::vector<std::string> heldout_files() {
  std::vector<std::string> files;
  const std::string dir = test::shared_dir() + "/corpus/heldout";
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".txt") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());  // file-name order, as the reference used
  return files;
}

// The correctness anchor: transformers' full-forward perplexity of
// flagship-27m over the held-out books (64 windows of 512 tokens of the
// stream BOS, book, EOS, ... in file-name order). Tolerance 0.1% relative
// (bf16 weights are identical; fp32 summation order differs from PyTorch).
// The through-cache path is checked against the full forward on 4 windows
// here (1e-4 relative); scripts/eval_reference.sh checks all 64 by both paths.
TEST(Perplexity, FlagshipHeldoutMatchesTransformers) {
  const auto files = heldout_files();
  ASSERT_FALSE(files.empty()) << "no corpus/heldout in the repo or ../shared";
  const auto ref = test::load_json(kFlagship + "/reference.json")["heldout_ppl_fp32"];
  const int64_t W = ref["window"].get<int64_t>(), K = ref["windows"].get<int64_t>();
  ops::set_num_threads(0);  // all cores
  LoadedModel lm = load_model(kFlagship);
  ASSERT_TRUE(lm.tokenizer);
  ASSERT_GE(lm.bos_id, 0);
  ASSERT_FALSE(lm.eos_ids.empty());
  auto streams = eval::tokenize_files(files, *lm.tokenizer, lm.bos_id, lm.eos_ids[0]);
  auto windows = eval::cut_windows({eval::concatenate(streams)}, W, K);
  ASSERT_EQ(int64_t(windows.size()), K);
  CacheSpec fp32;
  auto full = eval::score_windows(*lm.model, windows, eval::Path::Full, fp32);
  EXPECT_EQ(full.total.count, ref["tokens_scored"].get<int64_t>());
  EXPECT_NEAR(full.total.ppl() / ref["ppl"].get<double>(), 1.0, 1e-3)
      << "ours " << full.total.ppl() << " transformers " << ref["ppl"].get<double>();

  std::vector<Ids> few(windows.begin(), windows.begin() + 4);
  auto f4 = eval::score_windows(*lm.model, few, eval::Path::Full, fp32);
  auto c4 = eval::score_windows(*lm.model, few, eval::Path::Cache, fp32);
  EXPECT_NEAR(c4.total.ppl() / f4.total.ppl(), 1.0, 1e-4);
}

// flagship-long-31m, the 4K-context model: transformers' dense held-out
// perplexity at window 4,096 (16 windows of the stream BOS, book, EOS, ... in
// file-name order, not re-prefixed with BOS, 4,095 predictions each) within
// 0.05% relative (bf16 weights identical, fp32 sums in another order), and
// the decode path through the fp32 cache within 1e-4 of the full forward on
// the first window (all 4,095 steps at up to 4,095 cached tokens).
TEST(Perplexity, FlagshipLongHeldoutMatchesTransformersAtWindow4096) {
  const std::string dir = test::repo_dir() + "/models/flagship-long-31m";
  const auto files = heldout_files();
  ASSERT_FALSE(files.empty()) << "no corpus/heldout in ../shared";
  const auto ref = test::load_json(dir + "/reference.json")["heldout_ppl_fp32"];
  const int64_t W = ref["window"].get<int64_t>(), K = ref["windows"].get<int64_t>();
  ASSERT_EQ(W, 4096);
  ops::set_num_threads(0);
  LoadedModel lm = load_model(dir);
  ASSERT_TRUE(lm.tokenizer);
  auto streams = eval::tokenize_files(files, *lm.tokenizer, lm.bos_id, lm.eos_ids.at(0));
  auto windows = eval::cut_windows({eval::concatenate(streams)}, W, K);
  ASSERT_EQ(int64_t(windows.size()), K);
  CacheSpec fp32;
  auto full = eval::score_windows(*lm.model, windows, eval::Path::Full, fp32);
  EXPECT_EQ(full.total.count, ref["tokens_scored"].get<int64_t>());
  EXPECT_NEAR(full.total.ppl() / ref["ppl"].get<double>(), 1.0, 5e-4)
      << "ours " << full.total.ppl() << " transformers " << ref["ppl"].get<double>();
  std::printf("flagship-long-31m window 4096 x %lld: ours %.6f transformers %.6f (%+.2e)\n", (long long)K,
              full.total.ppl(), ref["ppl"].get<double>(), full.total.ppl() / ref["ppl"].get<double>() - 1);

  std::vector<Ids> first(windows.begin(), windows.begin() + 1);
  auto f1 = eval::score_windows(*lm.model, first, eval::Path::Full, fp32);
  auto c1 = eval::score_windows(*lm.model, first, eval::Path::Cache, fp32);
  EXPECT_NEAR(c1.total.ppl() / f1.total.ppl(), 1.0, 1e-4);
  std::printf("window 1: full %.6f through cache %.6f (%+.2e)\n", f1.total.ppl(), c1.total.ppl(),
              c1.total.ppl() / f1.total.ppl() - 1);
}

}  // namespace
}  // namespace ptllm
