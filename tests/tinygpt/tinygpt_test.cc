// .tinygpt fixtures (../shared/fixtures/tinygpt, made by an independent PyTorch
// implementation of the spec): logits, greedy decoding through the cache,
// YOCO cache size, and every malformed-file error the spec names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/session.h"
#include "io/safetensors.h"
#include "kv/reference_cache.h"
#include "model/model.h"
#include "test_util.h"

namespace ptllm {
namespace {
namespace fs = std::filesystem;

constexpr double kLogitRelTol = 1e-4;  // max|Δ| <= 1e-4 · max|ref| (fp32 weights and arithmetic)
constexpr double kMarginFloor = 1e-3;  // steps with a smaller top-1/top-2 margin may flip

std::string fx(const std::string& name) { return test::fixture("tinygpt/" + name); }

class TinyGptFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyGptFixture, LogitsMatchReference) {
  auto model = Model::load_tinygpt(fx(GetParam() + ".tinygpt"), nullptr);
  TensorStore ref;
  ref.add_file(fx(GetParam() + ".reference.safetensors"));
  const TensorView& it = ref.get("input_ids");
  const TensorView& lt = ref.get("logits");
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < it.numel(); ++i)
    ids.push_back(it.dtype == DType::I64 ? int32_t(it.as<int64_t>()[i]) : it.as<int32_t>()[i]);
  const int64_t V = model->config().vocab_size;
  ASSERT_EQ(lt.numel(), int64_t(ids.size()) * V);
  auto cache = make_default_cache(*model, int64_t(ids.size()));
  std::vector<float> logits(ids.size() * size_t(V));
  model->forward(ids.data(), int64_t(ids.size()), *cache, logits.data(), true);
  double max_ref = 0, max_diff = 0;
  for (int64_t i = 0; i < lt.numel(); ++i) {
    max_ref = std::max(max_ref, double(std::fabs(lt.as<float>()[i])));
    max_diff = std::max(max_diff, double(std::fabs(logits[size_t(i)] - lt.as<float>()[i])));
  }
  EXPECT_LE(max_diff, kLogitRelTol * max_ref);
}

TEST_P(TinyGptFixture, GreedyThroughDecodeMatchesReference) {
  auto model = Model::load_tinygpt(fx(GetParam() + ".tinygpt"), nullptr);
  auto ref = test::load_json(fx(GetParam() + ".reference.json"));
  auto prompt = ref["greedy_prompt"].get<std::vector<int32_t>>();
  auto expect = ref["greedy_new_tokens"].get<std::vector<int32_t>>();
  auto margin = ref["greedy_top1_top2_margin"].get<std::vector<double>>();
  std::vector<float> logits(size_t(model->config().vocab_size));
  auto cache = make_default_cache(*model, int64_t(prompt.size() + expect.size()));
  model->forward(prompt.data(), int64_t(prompt.size()), *cache, logits.data(), false);
  int checked = 0;
  for (size_t i = 0; i < expect.size(); ++i) {
    if (margin[i] > kMarginFloor) {
      EXPECT_EQ(Sampler::argmax(logits), expect[i]) << "step " << i;
      ++checked;
    }
    model->forward(&expect[i], 1, *cache, logits.data(), false);  // teacher-forced
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TinyGptFixture, ::testing::Values("tiny-plain", "tiny-yoco", "tiny-yoco-swa"));

TEST(TinyGpt, YocoCacheHoldsSelfLayersPlusOne) {
  auto yoco = Model::load_tinygpt(fx("tiny-yoco.tinygpt"), nullptr);
  const auto& c = yoco->config();
  ASSERT_TRUE(c.yoco());
  const int64_t T = 40;
  auto cache = make_default_cache(*yoco, T);
  std::vector<int32_t> ids(T, 5);
  std::vector<float> logits(size_t(c.vocab_size));
  yoco->forward(ids.data(), T, *cache, logits.data(), false);
  // A plain model of the same shape stores n_layers layers' worth.
  KVCacheShape plain_shape = yoco->cache_shape(T);
  plain_shape.n_layers = c.n_layers;
  plain_shape.layer_window.clear();
  Fp32KVCache plain(plain_shape);
  std::vector<float> kv(size_t(T * c.n_kv_heads * c.head_dim), 0.5f);
  for (int64_t l = 0; l < c.n_layers; ++l) plain.append(l, kv.data(), kv.data(), T);
  EXPECT_EQ(cache->payload_bytes() * size_t(c.n_layers), plain.payload_bytes() * size_t(c.yoco_self_layers + 1));
  EXPECT_EQ(cache->shape().n_layers, c.yoco_self_layers + 1);
}

// tiny-yoco-swa: self-decoder layers attend over a window of 16, so their
// caches hold at most 16 entries while decoding (the global K/V keeps all),
// and logits stay those of the reference (which recomputes everything).
TEST(TinyGpt, SelfWindowCapsSelfDecoderCaches) {
  auto model = Model::load_tinygpt(fx("tiny-yoco-swa.tinygpt"), nullptr);
  const auto& c = model->config();
  ASSERT_EQ(c.yoco_self_window, 16);
  TensorStore ref;
  ref.add_file(fx("tiny-yoco-swa.reference.safetensors"));
  const TensorView& it = ref.get("input_ids");
  const TensorView& lt = ref.get("logits");
  const int64_t T = it.numel(), V = c.vocab_size;
  auto cache = make_default_cache(*model, T);
  std::vector<float> logits(static_cast<size_t>(V));
  double max_ref = 0, max_diff = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = it.dtype == DType::I64 ? int32_t(it.as<int64_t>()[t]) : it.as<int32_t>()[t];
    model->forward(&id, 1, *cache, logits.data(), false);
    for (int64_t l = 0; l < c.yoco_self_layers; ++l) ASSERT_LE(cache->stored(l), 16) << "layer " << l << " step " << t;
    EXPECT_EQ(cache->stored(c.yoco_self_layers), t + 1);
    for (int64_t v = 0; v < V; ++v) {
      max_ref = std::max(max_ref, double(std::fabs(lt.as<float>()[t * V + v])));
      max_diff = std::max(max_diff, double(std::fabs(logits[size_t(v)] - lt.as<float>()[t * V + v])));
    }
  }
  EXPECT_GT(T, 16);
  EXPECT_LE(max_diff, kLogitRelTol * max_ref);
}

// ---- malformed files: each a one-line Error naming the file and the problem ----

std::string tmp(const std::string& name) {
  auto d = fs::temp_directory_path() / ("ptllm_tg_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

// Rewrites tiny-plain with edited metadata and/or without one tensor.
std::string rewrite(const std::string& name, const std::function<void(std::map<std::string, std::string>&)>& edit_meta,
                    const std::string& drop = "", std::vector<int64_t> reshape = {}) {
  TensorStore s;
  s.add_file(fx("tiny-plain.tinygpt"));
  auto meta = s.metadata();
  edit_meta(meta);
  std::vector<TensorToWrite> w;
  std::vector<float> zeros(1 << 16, 0.f);
  for (auto& [n, t] : s.all()) {
    if (n == drop) {
      if (!reshape.empty()) w.push_back({n, DType::F32, reshape, zeros.data()});
      continue;
    }
    w.push_back({n, t.dtype, t.shape, t.data});
  }
  const std::string p = tmp(name);
  write_safetensors(p, w, meta);
  return p;
}

std::string load_error(const std::string& path) {
  try {
    Model::load_tinygpt(path, nullptr);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TinyGptErrors, WrongFormat) {
  auto p = rewrite("fmt.tinygpt", [](auto& m) { m["format"] = "gguf"; });
  auto e = load_error(p);
  EXPECT_NE(e.find("expected \"tinygpt\""), std::string::npos) << e;
  EXPECT_NE(e.find(p), std::string::npos) << e;
}

TEST(TinyGptErrors, UnknownVersion) {
  auto e = load_error(rewrite("ver.tinygpt", [](auto& m) { m["version"] = "7"; }));
  EXPECT_NE(e.find("unknown .tinygpt version \"7\""), std::string::npos) << e;
}

TEST(TinyGptErrors, ConfigMissingKey) {
  auto e = load_error(rewrite("cfg.tinygpt", [](auto& m) {
    auto j = nlohmann::json::parse(m["config"]);
    j.erase("head_dim");
    m["config"] = j.dump();
  }));
  EXPECT_NE(e.find("missing required key \"head_dim\""), std::string::npos) << e;
}

TEST(TinyGptErrors, MissingTensorAndWrongShape) {
  auto e = load_error(rewrite("miss.tinygpt", [](auto&) {}, "layers.1.attn.wq.weight"));
  EXPECT_NE(e.find("missing tensor"), std::string::npos) << e;
  e = load_error(rewrite("shape.tinygpt", [](auto&) {}, "layers.1.attn.wq.weight", {64, 63}));
  EXPECT_NE(e.find("has shape [64, 63], expected [64, 64]"), std::string::npos) << e;
}

TEST(TinyGptErrors, TruncatedAndOverlapping) {
  const std::string src = fx("tiny-plain.tinygpt");
  const std::string p = tmp("trunc.tinygpt");
  {
    std::ifstream in(src, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(p, std::ios::binary) << all.substr(0, all.size() - 100);
  }
  auto e = load_error(p);
  EXPECT_NE(e.find("outside the file"), std::string::npos) << e;
  // Overlap: point two tensors at the same bytes.
  const std::string q = tmp("overlap.tinygpt");
  {
    std::ifstream in(src, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t hl;
    std::memcpy(&hl, all.data(), 8);
    auto h = nlohmann::json::parse(all.substr(8, hl));
    h["layers.0.attn_norm.weight"]["data_offsets"] = h["layers.0.ffn_norm.weight"]["data_offsets"];
    std::string hs = h.dump();
    while (hs.size() % 8) hs.push_back(' ');
    const uint64_t new_len = hs.size();  // offsets are relative to the data section, so they stay valid
    std::ofstream out(q, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&new_len), 8);
    out << hs << all.substr(8 + hl);
  }
  e = load_error(q);
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
}

}  // namespace
}  // namespace ptllm
