// GGUF models against independent references: llama.cpp's stories260K GGUF
// against its Hugging Face form (converted with the Q/K rows moved back, and
// checked against llama2.c), transformers' logits for every tiny HF fixture
// family after our HF -> GGUF convert, and the flagship at f16/bf16.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/session.h"
#include "io/gguf.h"
#include "model/gguf_convert.h"
#include "model/gguf_model.h"
#include "model/random_model.h"
#include "ops/quant.h"
#include "test_util.h"
#include "tokenizer/gguf_file.h"

namespace ptllm {
namespace {
using test::error_of;
using test::tmp_path;

std::vector<float> full_logits(const Model& m, const std::vector<int32_t>& ids) {
  auto cache = make_default_cache(m, int64_t(ids.size()));
  std::vector<float> out(ids.size() * size_t(m.config().vocab_size));
  m.forward(ids.data(), int64_t(ids.size()), *cache, out.data(), true);
  return out;
}

// max|a - b| / max|b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double md = 0, mr = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_TRUE(std::isfinite(a[i])) << i;
    md = std::max(md, double(std::fabs(a[i] - b[i])));
    mr = std::max(mr, double(std::fabs(b[i])));
  }
  return md / mr;
}

std::vector<int32_t> greedy(const Model& m, std::vector<int32_t> prompt, int n) {
  auto cache = make_default_cache(m, int64_t(prompt.size()) + n);
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.forward(prompt.data(), int64_t(prompt.size()), *cache, logits.data(), false);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(id);
    m.forward(&id, 1, *cache, logits.data(), false);
  }
  return out;
}

std::vector<int32_t> some_ids(int n, int vocab) {
  std::vector<int32_t> ids = {1};
  for (int i = 1; i < n; ++i) ids.push_back(int32_t((i * 7919 + 13) % vocab));
  return ids;
}

const std::string kStories = test::shared_dir() + "/models/stories260K";

TEST(GgufModel, PermutationMovesRowsAndRoundTrips) {
  // One head of 4 rows: HF rows (half 0: j 0,1; half 1: j 0,1) -> GGUF 2j + half.
  const std::byte in[4] = {std::byte{10}, std::byte{11}, std::byte{12}, std::byte{13}};
  std::byte g[4], back[4];
  permute_qk_rows(in, g, 1, 4, 1, /*to_gguf=*/true);
  EXPECT_EQ(g[0], std::byte{10});
  EXPECT_EQ(g[1], std::byte{12});
  EXPECT_EQ(g[2], std::byte{11});
  EXPECT_EQ(g[3], std::byte{13});
  permute_qk_rows(g, back, 1, 4, 1, false);
  EXPECT_EQ(std::memcmp(in, back, 4), 0);
  std::vector<std::byte> big(3 * 8 * 5), p(big.size()), q(big.size());
  for (size_t i = 0; i < big.size(); ++i) big[i] = std::byte(i);
  permute_qk_rows(big.data(), p.data(), 3, 8, 5, true);
  EXPECT_NE(p, big);
  permute_qk_rows(p.data(), q.data(), 3, 8, 5, false);
  EXPECT_EQ(q, big);
}

TEST(GgufModel, TensorNamesMapBothWays) {
  EXPECT_EQ(hf_name_from_gguf("blk.11.attn_q.weight"), "model.layers.11.self_attn.q_proj.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.0.ffn_down.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(hf_name_from_gguf("output.weight"), "lm_head.weight");
  EXPECT_EQ(hf_name_from_gguf("rope_freqs.weight"), "");
  EXPECT_EQ(hf_name_from_gguf("blk.x.attn_q.weight"), "");
  for (const char* g : {"token_embd.weight", "output_norm.weight", "blk.3.attn_k.bias", "blk.2.ffn_norm.weight",
                        "blk.7.attn_output.weight", "blk.1.attn_norm.weight", "blk.0.ffn_gate.weight"})
    EXPECT_EQ(gguf_name_from_hf(hf_name_from_gguf(g)), g);
}

// llama.cpp's stories260K.gguf gives the HF folder's logits and greedy tokens.
TEST(GgufModel, Stories260KMatchesHfFolder) {
  auto hf = Model::load_hf(kStories);
  auto gg = load_gguf_model(kStories + "/stories260K.gguf");
  const ModelConfig &a = hf->config(), &b = gg->config();
  EXPECT_EQ(b.model_type, "llama");
  EXPECT_EQ(b.vocab_size, a.vocab_size);
  EXPECT_EQ(b.hidden_size, a.hidden_size);
  EXPECT_EQ(b.intermediate_size, a.intermediate_size);
  EXPECT_EQ(b.n_layers, a.n_layers);
  EXPECT_EQ(b.n_heads, a.n_heads);
  EXPECT_EQ(b.n_kv_heads, a.n_kv_heads);
  EXPECT_EQ(b.head_dim, a.head_dim);
  EXPECT_EQ(b.tie_embeddings, a.tie_embeddings);
  EXPECT_NEAR(b.rms_eps, a.rms_eps, 1e-12);
  EXPECT_EQ(b.rope.theta, a.rope.theta);
  EXPECT_EQ(b.bos_id, 1);
  EXPECT_EQ(b.eos_ids, std::vector<int32_t>{2});
  // Both F32: the same weights after un-permuting, so the same arithmetic.
  const auto ids = some_ids(64, int(a.vocab_size));
  // Tolerance (f32 weights, f32 arithmetic, same kernels): 1e-5 relative.
  EXPECT_LE(rel_diff(full_logits(*gg, ids), full_logits(*hf, ids)), 1e-5);
  EXPECT_EQ(greedy(*gg, {1}, 100), greedy(*hf, {1}, 100));
  // The un-permuted Q/K must equal the HF tensors byte for byte.
  for (const char* n : {"model.layers.0.self_attn.q_proj.weight", "model.layers.4.self_attn.k_proj.weight"}) {
    const TensorView &x = gg->tensors().get(n), &y = hf->tensors().get(n);
    ASSERT_EQ(x.shape, y.shape);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << n;
  }
}

TEST(GgufModel, LoadModelFromGgufPath) {
  LoadedModel lm = load_model(kStories + "/stories260K.gguf");
  ASSERT_TRUE(lm.model);
  EXPECT_EQ(lm.bos_id, 1);
  EXPECT_EQ(lm.eos_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(lm.add_bos);
}

// Our convert (HF -> GGUF f32) of every tiny transformers fixture reproduces
// transformers' logits: the permutation, qwen2's biases (not permuted), tied
// embeddings, Llama 3 RoPE scaling through rope_freqs, Mistral's window.
class GgufFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufFixture, ConvertedLogitsMatchTransformers) {
  const std::string dir = test::fixture("hf/" + GetParam());
  const std::string out = tmp_path(GetParam() + ".gguf");
  GgufConvertOptions opt;
  opt.type = DType::F32;
  opt.write_tokenizer = [](GgufWriter&, const std::string&) {};  // the fixtures have no tokenizer
  convert_to_gguf(dir, out, opt);
  auto model = load_gguf_model(out);
  TensorStore ref;
  ref.add_file(dir + "/reference.safetensors");
  const TensorView& ids_t = ref.get("input_ids");
  const std::vector<int32_t> ids(ids_t.as<int32_t>(), ids_t.as<int32_t>() + ids_t.numel());
  const TensorView& lt = ref.get("logits");
  const std::vector<float> expect(lt.as<float>(), lt.as<float>() + lt.numel());
  // The same tolerance as model_test's HF check (f32, different summation order).
  EXPECT_LE(rel_diff(full_logits(*model, ids), expect), 1e-4);
  const auto hf = Model::load_hf(dir);
  EXPECT_EQ(model->config().sliding_window, hf->config().sliding_window);
  EXPECT_EQ(model->config().qkv_bias, hf->config().qkv_bias);
  EXPECT_EQ(model->config().tie_embeddings, hf->config().tie_embeddings);
  GgufFile f(out);
  EXPECT_EQ(f.get_string("general.architecture"), GetParam().starts_with("qwen2") ? "qwen2" : "llama");
  EXPECT_EQ(f.find_tensor("rope_freqs.weight") != nullptr, GetParam().starts_with("llama3"));
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFixture,
                         ::testing::Values("llama-gqa-tied", "llama-mha-untied", "llama3-rope-scaling-headdim",
                                           "mistral-sliding-window", "qwen2-qkv-bias"));

TEST(GgufModel, GgufToHfFolderRoundTrip) {
  const std::string out = tmp_path("stories_hf");
  convert_gguf_to_hf(kStories + "/stories260K.gguf", out, std::nullopt);
  auto back = Model::load_hf(out);
  auto gg = load_gguf_model(kStories + "/stories260K.gguf");
  const auto ids = some_ids(32, 512);
  EXPECT_EQ(full_logits(*back, ids), full_logits(*gg, ids));  // F32 kept: identical
  convert_gguf_to_hf(kStories + "/stories260K.gguf", out + "_bf16", DType::BF16);
  EXPECT_EQ(Model::load_hf(out + "_bf16")->tensors().get("model.norm.weight").dtype, DType::BF16);
}

// The flagship (bf16 HF folder) through our convert. bf16 -> GGUF bf16 keeps
// every weight bit: logits are identical. bf16 -> f16 is exact except for
// weights below f16's normal range (2^-14), which lose mantissa bits as
// subnormals: tolerance 1e-5 of max|logit| (measured: 4.8e-7).
TEST(GgufModel, FlagshipConvertMatchesHfFolder) {
  const std::string dir = test::repo_dir() + "/models/flagship-27m";
  auto hf = Model::load_hf(dir);
  const auto ids = some_ids(48, 32000);
  const auto ref = full_logits(*hf, ids);
  for (DType t : {DType::BF16, DType::F16}) {
    const std::string out = tmp_path(std::string("flagship-") + std::string(dtype_name(t)) + ".gguf");
    GgufConvertOptions opt;
    opt.type = t;
    opt.write_tokenizer = [](GgufWriter& w, const std::string& tok) { write_gguf_tokenizer(tok, "", w); };
    convert_to_gguf(dir, out, opt);
    auto gg = load_gguf_model(out);
    const double d = rel_diff(full_logits(*gg, ids), ref);
    std::printf("flagship GGUF %s: max|dlogit| / max|logit| = %.3g\n", std::string(dtype_name(t)).c_str(), d);
    if (t == DType::BF16) EXPECT_EQ(d, 0.0);
    else EXPECT_LE(d, 1e-5);
    GgufFile f(out);
    EXPECT_EQ(f.tensor("blk.0.attn_q.weight").dtype, t);
    EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").dtype, DType::F32);
    // The tokenizer keys llama.cpp's own converter wrote for this model.
    GgufFile ref_file(test::shared_dir() + "/models/flagship-27m-gguf/flagship-q8_0.gguf");
    EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), ref_file.get_string_array("tokenizer.ggml.tokens"));
    EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type"), ref_file.get_i32_array("tokenizer.ggml.token_type"));
    for (const char* k : {"llama.block_count", "llama.context_length", "llama.embedding_length",
                          "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
                          "llama.attention.key_length", "llama.rope.dimension_count", "llama.vocab_size",
                          "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id"})
      EXPECT_EQ(f.get_u32(k), ref_file.get_u32(k)) << k;
    EXPECT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), ref_file.get_f32("llama.attention.layer_norm_rms_epsilon"));
    // Permuted the GGUF way: the same row order as llama.cpp's own file (whose
    // q8_0 rows hold the same values up to quantisation).
    const TensorView &mine = f.tensor("blk.0.attn_k.weight"), &theirs = ref_file.tensor("blk.0.attn_k.weight");
    ASSERT_EQ(mine.shape, theirs.shape);
    for (int64_t r : {0, 1, 2, 17, 255}) {
      // Q8_0 block = f16 scale + 32 int8: compare row r's first block, dequantised.
      const std::byte* b = theirs.data + size_t(r) * (256 / 32) * 34;
      const float d8 = f16_to_f32(uint16_t(uint16_t(b[0]) | uint16_t(b[1]) << 8));
      for (int j = 0; j < 32; ++j) {
        const float q = d8 * float(int8_t(b[2 + j]));
        // One quantum: rounding plus the f16 rounding of the scale (a wrong row is off by ~20 quanta).
        EXPECT_NEAR(mine.at_f32(r * 256 + j), q, std::fabs(d8) * 1.01f) << "row " << r << " col " << j;
      }
    }
  }
}

// llama.cpp's own quantisations of the flagship run through the block kernels.
// Bounds on max|dlogit| / max|logit| against the bf16 HF folder over 48
// random-id positions (a worst case over 1.5M logits; measured 0.065, 0.28,
// 0.51), and q8_0's greedy continuation of a real prompt equals the HF
// folder's (llama.cpp's own q8_0 run gives the same 24 ids: gguf_anchor).
TEST(GgufModel, LlamaCppQuantisedFlagshipRuns) {
  auto hf = Model::load_hf(test::repo_dir() + "/models/flagship-27m");
  const auto ids = some_ids(48, 32000);
  const auto ref = full_logits(*hf, ids);
  for (const auto& [file, tol] : std::vector<std::pair<std::string, double>>{
           {"flagship-q8_0.gguf", 0.1}, {"flagship-q4_k_m.gguf", 0.4}, {"flagship-q4_0.gguf", 0.7}}) {
    auto q = load_gguf_model(test::shared_dir() + "/models/flagship-27m-gguf/" + file);
    const double d = rel_diff(full_logits(*q, ids), ref);
    std::printf("%s: max|dlogit| / max|logit| = %.3g\n", file.c_str(), d);
    EXPECT_LE(d, tol) << file;
    EXPECT_GT(d, 0.0) << file;  // really quantised
    if (file == "flagship-q8_0.gguf") {
      const std::vector<int32_t> prompt = {1, 9038, 2501, 263, 931};  // "Once upon a time"
      EXPECT_EQ(greedy(*q, prompt, 24), greedy(*hf, prompt, 24));
    }
  }
}

// `--weights TYPE` (LoadOptions::weights) quantises a bf16 folder's matrices
// on load. The reference is the other route to the same weights: our `convert
// --type TYPE` GGUF file (written, re-read, Q/K rows permuted and un-permuted),
// whose logits must be bit-identical: the same rows quantised by the same
// quantiser, multiplied by the same kernels. That the weights really are
// quantised: the dtype, and logits that differ from bf16's.
TEST(GgufModel, WeightsOnLoadEqualConvertedGguf) {
  const std::string dir = test::repo_dir() + "/models/flagship-27m";
  const auto ids = some_ids(40, 32000);
  const auto ref = full_logits(*Model::load_hf(dir), ids);
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) {
    const std::string name(dtype_name(t));
    const std::string out = tmp_path("flagship-weights-" + name + ".gguf");
    GgufConvertOptions opt;
    opt.type = t;
    opt.write_tokenizer = [](GgufWriter& w, const std::string& tok) { write_gguf_tokenizer(tok, "", w); };
    convert_to_gguf(dir, out, opt);
    const auto from_gguf = full_logits(*load_gguf_model(out), ids);
    std::filesystem::remove(out);
    LoadOptions lo;
    lo.weights = t;
    lo.relay_weights = false;  // as stored (the 16-row layouts: Q4_0RelaidAtLoad... below)
    LoadedModel lm = load_model(dir, lo);
    EXPECT_EQ(lm.model->tensors().get("model.layers.0.self_attn.q_proj.weight").dtype, t) << name;
    EXPECT_EQ(lm.model->tensors().get("model.embed_tokens.weight").dtype, t) << name;  // tied: the output too
    EXPECT_EQ(lm.model->tensors().get("model.norm.weight").dtype, DType::BF16) << name;  // 1-D kept
    EXPECT_NE(lm.model->tensors().source_of("model.embed_tokens.weight").find("(--weights: "), std::string::npos);
    const auto on_load = full_logits(*lm.model, ids);
    EXPECT_EQ(on_load, from_gguf) << name;
    const double d = rel_diff(on_load, ref);
    std::printf("--weights %s: max|dlogit| / max|logit| vs bf16 = %.3g\n", name.c_str(), d);
    EXPECT_GT(d, 0.0) << name;
    // Measured 0.062, 0.53, 0.38, 0.13 (every matrix incl. the tied output at
    // the one type; llama.cpp's q8_0/q4_k_m/q4_0 files: 0.065, 0.28, 0.51).
    const double bound = t == DType::Q8_0 ? 0.1 : t == DType::Q6_K ? 0.2 : t == DType::Q4_K ? 0.5 : 0.7;
    EXPECT_LE(d, bound) << name;
  }
}

// Q8_0, Q4_0 and Q4_K re-laid at load (the _R16 types, core/dtype.h): llama.cpp's
// files read in are re-laid in place, Q/K (permuted into copies) too, a mapped
// file's tensors are left as stored (but for those copies), and `--weights`
// re-lays what it quantises. Q4_0: bit-identical logits, prefill and a
// batched decode step (its kernel does Q4_0's arithmetic on the same
// integers). Q8_0 and Q4_K (the Q4_K_M file, Q6_K left as it is): the same exact
// integer sums added in another fp32 order; each layer's activations are
// re-quantised to int8, so a last-bit difference can move a code and grow:
// logits within 0.1 of max |logit| (measured 0.029; the stored Q4_K itself
// differs by 0.039 between the AVX2 and AVX-512 levels and 0.031 between
// scalar and AVX-512) and the same greedy tokens at every position. Where no
// kernel exists nothing is re-laid.
void check_relaid(const std::string& what, const LoadedModel& a, const LoadedModel& b, const LoadedModel* mapped,
                  DType type) {
  int n_relaid = 0;
  for (const auto& [n, v] : a.model->tensors().all()) {
    const DType was = b.model->tensors().get(n).dtype;
    if (mapped) {
      const bool copied = n.find("q_proj") != std::string::npos || n.find("k_proj") != std::string::npos;
      EXPECT_EQ(mapped->model->tensors().get(n).dtype, copied ? v.dtype : was) << what << " " << n;
    }
    const bool relays = ops::rows16_pays(was) && v.shape.size() == 2 && v.shape[0] % 16 == 0;
    EXPECT_EQ(v.dtype, relays ? ops::rows16_type(was) : was) << what << " " << n;
    n_relaid += v.dtype != was;
  }
  if (ops::rows16_pays(DType::Q4_0)) EXPECT_GT(n_relaid, 10) << what;
  const auto ids = some_ids(24, 32000);
  const auto la = full_logits(*a.model, ids), lb = full_logits(*b.model, ids);
  const bool exact = type == DType::Q4_0 || !ops::rows16_pays(type);
  if (exact) EXPECT_EQ(la, lb) << what;
  else EXPECT_LE(rel_diff(la, lb), 0.1) << what;
  if (mapped && exact) EXPECT_EQ(la, full_logits(*mapped->model, ids)) << what;
  // Greedy ids per position agree.
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto row = [&](const std::vector<float>& l) {
      return std::max_element(l.begin() + t * 32000, l.begin() + (t + 1) * 32000) - (l.begin() + t * 32000);
    };
    EXPECT_EQ(row(la), row(lb)) << what << " position " << t;
  }
  // A decode step over two sequences at once (forward_batch), against b's.
  std::vector<std::unique_ptr<KVCache>> ca, cb;
  std::vector<KVCache*> pa, pb;
  for (int s = 0; s < 2; ++s) {
    ca.push_back(make_default_cache(*a.model, 8));
    cb.push_back(make_default_cache(*b.model, 8));
    pa.push_back(ca.back().get());
    pb.push_back(cb.back().get());
  }
  const int32_t two[] = {ids[3], ids[7]};
  std::vector<float> ya(2 * 32000), yb(ya.size());
  a.model->forward_batch(two, 2, pa.data(), ya.data());
  b.model->forward_batch(two, 2, pb.data(), yb.data());
  if (exact) EXPECT_EQ(ya, yb) << what;
  else EXPECT_LE(rel_diff(ya, yb), 0.1) << what;
}

TEST(GgufModel, Q8_0Q4_0AndQ4_KRelaidAtLoadGiveTheSameLogits) {
  for (const auto& [f, t] : {std::pair{"flagship-q4_0.gguf", DType::Q4_0}, {"flagship-q4_k_m.gguf", DType::Q4_K},
                              {"flagship-q8_0.gguf", DType::Q8_0}}) {
    const std::string path = test::shared_dir() + "/models/flagship-27m-gguf/" + f;
    LoadOptions keep, mapped;
    keep.relay_weights = false;
    mapped.file_load = FileLoad::Map;
    const LoadedModel a = load_model(path), b = load_model(path, keep), c = load_model(path, mapped);
    check_relaid(f, a, b, &c, t);
  }
  const std::string dir = test::repo_dir() + "/models/flagship-27m";
  for (DType t : {DType::Q4_0, DType::Q4_K, DType::Q8_0}) {
    LoadOptions on, off;
    on.weights = off.weights = t;
    off.relay_weights = false;
    std::string name(dtype_name(t));
    for (char& ch : name) ch = char(std::tolower(ch));
    check_relaid("--weights " + name, load_model(dir, on), load_model(dir, off), nullptr, t);
  }
  // --weights of the file's own type re-lays it too (a copy: the file is mapped then).
  LoadOptions same, same_keep;
  same.weights = same_keep.weights = DType::Q8_0;
  same_keep.relay_weights = false;
  const std::string q8 = test::shared_dir() + "/models/flagship-27m-gguf/flagship-q8_0.gguf";
  check_relaid("--weights q8_0 on q8_0", load_model(q8, same), load_model(q8, same_keep), nullptr, DType::Q8_0);
}

// The tiny fixtures: rows that are not whole blocks fall back to F16 exactly
// as convert does; Qwen2's biases and unpermuted rows; a file already of the
// type is left as it is.
TEST(GgufModel, WeightsOnLoadFixturesAndNoOp) {
  for (const std::string fx : {"llama-gqa-tied", "qwen2-qkv-bias"}) {
    const std::string dir = test::fixture("hf/" + fx), out = tmp_path(fx + "-q8_0.gguf");
    GgufConvertOptions opt;
    opt.type = DType::Q8_0;
    opt.write_tokenizer = [](GgufWriter&, const std::string&) {};
    convert_to_gguf(dir, out, opt);
    auto gg = load_gguf_model(out);
    LoadOptions lo;
    lo.weights = DType::Q8_0;
    lo.relay_weights = false;  // as stored (the 16-row layouts: ...RelaidAtLoad... above)
    LoadedModel lm = load_model(dir, lo);
    const auto ids = some_ids(12, int(gg->config().vocab_size));
    EXPECT_EQ(full_logits(*lm.model, ids), full_logits(*gg, ids)) << fx;
    for (const auto& [n, v] : lm.model->tensors().all())
      if (v.shape.size() == 2) EXPECT_EQ(v.dtype, matrix_storage_type(v.shape[1], DType::Q8_0)) << fx << " " << n;
  }
  const std::string q8 = test::shared_dir() + "/models/flagship-27m-gguf/flagship-q8_0.gguf";
  LoadOptions lo, plain;
  lo.weights = DType::Q8_0;
  lo.relay_weights = plain.relay_weights = false;
  LoadedModel a = load_model(q8, plain), b = load_model(q8, lo);
  const std::string up = "model.layers.3.mlp.up_proj.weight";
  EXPECT_EQ(b.model->tensors().source_of(up), a.model->tensors().source_of(up));  // kept, not re-encoded
  EXPECT_EQ(b.model->tensors().source_of(up).find("--weights"), std::string::npos);
  const auto ids = some_ids(8, 32000);
  EXPECT_EQ(full_logits(*b.model, ids), full_logits(*a.model, ids));
}

TEST(GgufModel, ConfigErrorsNameFileAndKey) {
  const std::string p = tmp_path("bad_arch.gguf");
  {
    GgufWriter w;
    w.set_string("general.architecture", "gpt2");
    w.write(p);
  }
  std::string e = error_of([&] { load_gguf_model(p); });
  EXPECT_NE(e.find("unsupported general.architecture \"gpt2\""), std::string::npos) << e;
  EXPECT_NE(e.find(p), std::string::npos) << e;
  {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.embedding_length", 64);
    w.write(p);
  }
  e = error_of([&] { load_gguf_model(p); });
  EXPECT_NE(e.find("missing metadata key llama.block_count"), std::string::npos) << e;
  // A quantised file's config.
  GgufFile q(test::shared_dir() + "/models/flagship-27m-gguf/flagship-q4_k_m.gguf");
  const ModelConfig c = gguf_model_config(q);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_FALSE(c.tie_embeddings);
}

// make-random's writer at a small shape: loads, gives finite logits, has the
// byte-fallback vocabulary, weights at the requested scale, and one seed = one file.
TEST(GgufModel, RandomModelLoadsAndIsReproducible) {
  RandomModelOptions opt;
  opt.config = random_model_preset("llama-3.2-1b");
  opt.config.hidden_size = 128, opt.config.n_layers = 2, opt.config.n_heads = 4, opt.config.n_kv_heads = 2;
  opt.config.head_dim = 32, opt.config.intermediate_size = 256, opt.config.vocab_size = 300;
  opt.seed = 7;
  const std::string a = tmp_path("rand_a.gguf"), b = tmp_path("rand_b.gguf"), c = tmp_path("rand_c.gguf");
  write_random_gguf(a, opt);
  write_random_gguf(b, opt);
  opt.seed = 8;
  write_random_gguf(c, opt);
  auto bytes = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(bytes(a), bytes(b));
  EXPECT_NE(bytes(a), bytes(c));
  GgufFile f(a);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  const auto toks = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.size(), 300u);
  EXPECT_EQ(toks[3 + 0x41], "<0x41>");
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // the 1B preset is tied
  const TensorView& q = f.tensor("blk.1.attn_q.weight");
  EXPECT_EQ(q.dtype, DType::F16);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < q.numel(); ++i) sum += q.at_f32(i), sq += double(q.at_f32(i)) * q.at_f32(i);
  const double mean = sum / double(q.numel()), sd = std::sqrt(sq / double(q.numel()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.001);
  EXPECT_EQ(f.tensor("blk.0.ffn_norm.weight").at_f32(5), 1.f);
  auto m = load_gguf_model(a);
  EXPECT_TRUE(m->config().tie_embeddings);
  const auto logits = full_logits(*m, some_ids(16, 300));
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NE(error_of([] { random_model_preset("llama-9"); }).find("--preset llama-9"), std::string::npos);
}

}  // namespace
}  // namespace ptllm
