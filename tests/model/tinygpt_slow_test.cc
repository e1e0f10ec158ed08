// The 27M models as .tinygpt: the trained YOCO model reproduces its reference
// greedy text and held-out perplexity; flagship-27m survives HF -> .tinygpt ->
// HF bit-exactly and samples the same tokens from either form.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/session.h"
#include "model/convert.h"
#include "test_util.h"

namespace ptllm {
namespace {
namespace fs = std::filesystem;

constexpr double kMarginFloor = 1e-3;

std::vector<int32_t> greedy(const LoadedModel& lm, const std::vector<int32_t>& prompt, int64_t n) {
  Session s(lm, make_default_cache(*lm.model, int64_t(prompt.size()) + n));
  GenerateOptions go;
  go.max_new_tokens = n;
  go.ignore_eos = true;
  std::vector<int32_t> out;
  s.generate(prompt, go, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  return out;
}

TEST(FlagshipYoco, GreedyMatchesReference) {
  LoadedModel lm = load_model(test::repo_dir() + "/models/flagship-yoco-27m.tinygpt");
  ASSERT_TRUE(lm.tokenizer) << "tokenizer must be embedded";
  auto ref = test::load_json(test::repo_dir() + "/models/flagship-yoco-27m.reference.json");
  for (auto& p : ref["prompts"]) {
    auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    auto expect = p["greedy_new_tokens"].get<std::vector<int32_t>>();
    auto margin = p["top1_top2_margin"].get<std::vector<double>>();
    EXPECT_EQ(lm.tokenizer->encode(p["prompt"].get<std::string>()), prompt);
    auto got = greedy(lm, prompt, int64_t(expect.size()));
    for (size_t i = 0; i < expect.size(); ++i) {
      if (margin[i] <= kMarginFloor) break;  // a near-tie may legitimately flip the path
      ASSERT_EQ(got[i], expect[i]) << p["prompt"] << " step " << i;
    }
  }
}

// Held-out perplexity, the reference's definition: the stream BOS, book, EOS,
// BOS, book, ... (file-name order), 64 non-overlapping 512-token windows, each
// scored on its 511 next-token predictions by a full forward.
double heldout_ppl(const LoadedModel& lm) {
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(test::shared_dir() + "/corpus/heldout")) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<int32_t> stream;
  for (auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    stream.push_back(lm.bos_id);
    auto ids = lm.tokenizer->encode(text, false);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(lm.eos_ids.at(0));
  }
  const int64_t W = 512, K = 64, V = lm.model->config().vocab_size;
  EXPECT_GE(int64_t(stream.size()), W * K);
  std::vector<float> logits(size_t(W * V));
  double nll = 0;
  int64_t n = 0;
  for (int64_t w = 0; w < K; ++w) {
    const int32_t* ids = stream.data() + w * W;
    auto cache = make_default_cache(*lm.model, W);
    lm.model->forward(ids, W, *cache, logits.data(), true);
    for (int64_t t = 0; t + 1 < W; ++t) {
      const float* l = logits.data() + t * V;
      const float m = *std::max_element(l, l + V);
      double s = 0;
      for (int64_t v = 0; v < V; ++v) s += std::exp(double(l[v] - m));
      nll += -(double(l[ids[t + 1]] - m) - std::log(s));
      ++n;
    }
  }
  EXPECT_EQ(n, 32704);
  return std::exp(nll / double(n));
}

TEST(FlagshipYoco, HeldoutPerplexityWithinPointOnePercent) {
  LoadedModel lm = load_model(test::repo_dir() + "/models/flagship-yoco-27m.tinygpt");
  auto ref = test::load_json(test::repo_dir() + "/models/flagship-yoco-27m.reference.json");
  const double expect = ref["heldout_ppl_fp32"]["ppl"].get<double>();
  const double got = heldout_ppl(lm);
  EXPECT_NEAR(got, expect, 1e-3 * expect) << "got " << got;
}

TEST(Convert, FlagshipRoundTripIsBitExactAndSamplesTheSame) {
  const std::string src = test::repo_dir() + "/models/flagship-27m";
  const auto dir = fs::temp_directory_path() / ("ptllm_convert_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string tg = (dir / "flagship.tinygpt").string(), back = (dir / "back").string();
  convert_hf_to_tinygpt(src, tg, DType::BF16);
  convert_tinygpt_to_hf(tg, back, std::nullopt);
  // Every source tensor comes back with the same name, shape, dtype and bytes.
  TensorStore a = TensorStore::open_hf_dir(src), b = TensorStore::open_hf_dir(back);
  ASSERT_EQ(a.all().size(), b.all().size());
  for (auto& [name, t] : a.all()) {
    ASSERT_TRUE(b.has(name)) << name;
    const TensorView& u = b.get(name);
    ASSERT_EQ(u.shape, t.shape) << name;
    ASSERT_EQ(u.dtype, t.dtype) << name;
    ASSERT_EQ(std::memcmp(u.data, t.data, t.nbytes()), 0) << name;
  }
  // The .tinygpt samples exactly what the HF folder does (greedy and seeded).
  LoadedModel hf = load_model(src), one = load_model(tg);
  auto ref = test::load_json(src + "/reference.json");
  for (auto& p : ref["prompts"]) {
    auto prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(one.tokenizer->encode(p["prompt"].get<std::string>()), prompt);
    EXPECT_EQ(greedy(hf, prompt, 64), greedy(one, prompt, 64)) << p["prompt"];
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ptllm
