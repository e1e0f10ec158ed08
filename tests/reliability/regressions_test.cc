// Regression tests for what the fuzz targets (tests/fuzz) and the size audit
// found; each names the finding it guards. docs/RELIABILITY.md lists them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/finite.h"
#include "engine/decoder.h"
#include "engine/session.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

// Expects fn to throw ptllm::Error with `needle` in a one-line message.
template <typename F>
void expect_error(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/ptllm_rel_" + std::to_string(::getpid()) + "_" + name;
}

// ---------------------------------------------------------------- tokenizer
// Finding (fuzz_tokenizer_json): a 60-byte tokenizer.json with the vocab id
// 2^30 made the loader size its id tables for 2^30 entries (32 GiB of
// std::string: out of memory). Ids must now be below max(file size, 65536).
TEST(Regression, TokenizerHugeVocabIdIsRejectedWithoutAllocating) {
  const std::string j = R"({"model":{"type":"BPE","vocab":{"a":1073741824},"merges":[]}})";
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { Tokenizer::from_json(j); }, "model.vocab id 1073741824 for 'a' is out of range");
  // Generous bound (sanitizer builds, shared machine): the old code spent
  // seconds and gigabytes before failing.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// Finding (fuzz_tokenizer_json, UBSan): added token id 2147483647 overflowed
// `max_id + 1` (signed overflow) and then sized tables for 2^31 entries.
TEST(Regression, TokenizerAddedTokenIdNearIntMaxIsRejected) {
  const std::string j =
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":2147483647,"content":"x"}]})";
  expect_error([&] { Tokenizer::from_json(j); }, "added token 'x' id 2147483647 is out of range");
}

// The bound must not reject ordinary tokenizers: sparse ids below 65536 in a
// tiny file, and added tokens after the model vocabulary, still load.
TEST(Regression, TokenizerIdBoundKeepsSmallSparseVocabularies) {
  const std::string j =
      R"({"model":{"type":"BPE","vocab":{"a":0,"b":60000},"merges":[]},"added_tokens":[{"id":65535,"content":"<e>","special":true}]})";
  const Tokenizer t = Tokenizer::from_json(j);
  EXPECT_EQ(t.vocab_size(), 65536);
  EXPECT_EQ(t.token_to_id("b"), 60000);
}

// Finding (crafted input, ASan stack-overflow in fuzz_tokenizer_json): a
// normalizer Sequence nested 50,000 deep (a 2 MB file) recursed once per
// level in the loader and overflowed the stack. Nesting is capped at 64.
TEST(Regression, TokenizerDeeplyNestedSequenceIsRejected) {
  auto nested = [](const std::string& kind, const std::string& key, const std::string& leaf, int depth) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += R"({"type":"Sequence",")" + key + R"(":[)";
    s += leaf;
    for (int i = 0; i < depth; ++i) s += "]}";
    return R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},")" + kind + R"(":)" + s + "}";
  };
  expect_error([&] { Tokenizer::from_json(nested("normalizer", "normalizers", R"({"type":"Lowercase"})", 100000)); },
               "normalizer Sequence nested deeper than 64 levels");
  expect_error([&] { Tokenizer::from_json(nested("decoder", "decoders", R"({"type":"Fuse"})", 65)); },
               "decoder Sequence nested deeper than 64 levels");
  // 64 levels still load.
  const Tokenizer t = Tokenizer::from_json(nested("pre_tokenizer", "pretokenizers", R"({"type":"Digits"})", 64));
  EXPECT_EQ(t.vocab_size(), 1);
}

// Finding (fuzz_tokenizer_json, 43,498 runs in): with a Strip decoder of
// start 2, StreamDecoder's one-token context could not know how many leading
// spaces decode() strips: ids "▁ ▁ ▁ o" streamed as "o" but decode to " o".
TEST(Regression, StreamDecoderMatchesDecodeWithStripStartAboveOne) {
  const std::string j =
      R"({"model":{"type":"BPE","vocab":{"▁":0,"o":1},"merges":[]},)"
      R"("decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},)"
      R"({"type":"Fuse"},{"type":"Strip","content":" ","start":2,"stop":0}]}})";
  const Tokenizer t = Tokenizer::from_json(j);
  for (const std::vector<int32_t>& ids : std::vector<std::vector<int32_t>>{{0, 0, 0, 1}, {0, 1, 0, 0, 1}, {1, 0, 0}}) {
    StreamDecoder s(t);
    std::string streamed;
    for (int32_t id : ids) streamed += s.push(id);
    streamed += s.flush();
    EXPECT_EQ(streamed, t.decode(ids));
  }
  EXPECT_EQ(t.decode(std::vector<int32_t>{0, 0, 0, 1}), " o");
}

// Finding (fuzz_tokenizer_json re-run, 207,975 runs in): a component type
// holding a newline ("Sequ\nce") was echoed into a two-line error message.
// expect_error checks the message is one line.
TEST(Regression, ErrorsEchoingFileStringsStayOneLine) {
  expect_error([&] { Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"normalizer":{"type":"Sequ\nce"}})"); },
               "unsupported normalizer 'Sequ\\nce'");
  expect_error([&] { parse_hf_config(R"({"model_type":"lla\nma"})", "config.json"); },
               "unsupported architecture model_type \"lla\\nma\"");
}

// The contract itself, for any message: control bytes are escaped, so no
// caller has to remember to quote a name that came from a file.
TEST(Regression, ErrorEscapesControlBytes) {
  EXPECT_STREQ(Error("a\nb\rc\td\x01" "e\x7f").what(), "a\\nb\\rc\\td\\x01e\\x7f");
  EXPECT_STREQ(Error("plain: text, 'quoted' \xc3\xa9").what(), "plain: text, 'quoted' \xc3\xa9");  // UTF-8 kept
  try {
    fail("{}: cannot open", std::string("x\ny"));
    ADD_FAILURE() << "fail() returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "x\\ny: cannot open");
  }
}

// Finding (fuzz_tokenizer_json, UBSan): a TemplateProcessing special-token id
// 1.2e108 went through json::get<int32_t>() (float -> int out of range).
TEST(Regression, TokenizerFloatIdsAreErrors) {
  const std::string tpl =
      R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"post_processor":{"type":"TemplateProcessing",)"
      R"("single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<s>":{"ids":[1.22222e108]}}}})";
  expect_error([&] { Tokenizer::from_json(tpl); }, "TemplateProcessing special token id must be an integer token id");
  expect_error([&] { Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":3e10,"content":"x"}]})"); },
               "added token id must be an integer");
  expect_error([&] { Tokenizer::from_json(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"added_tokens":[{"id":-5,"content":"x"}]})"); },
               "added token 'x' has negative id");
}

// Finding (fuzz_tokenizer_json in the session-5 CI check, UBSan): a Strip
// decoder's "start" of 1.9e80 went through json::value<size_t>() (float ->
// integer out of range). Counts must be integers in [0, 2^20].
TEST(Regression, TokenizerStripDecoderCountsAreCheckedIntegers) {
  const auto with = [](const std::string& start) {
    return R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"decoder":{"type":"Strip","content":"a","start":)" +
           start + R"(,"stop":0}})";
  };
  expect_error([&] { Tokenizer::from_json(with("1.88889e80")); }, "Strip decoder \"start\" must be an integer in [0, 1048576]");
  expect_error([&] { Tokenizer::from_json(with("-1")); }, "Strip decoder \"start\" must be an integer");
  expect_error([&] { Tokenizer::from_json(with("\"2\"")); }, "Strip decoder \"start\" must be an integer");
  // Valid counts still load and act: start 1 strips one leading "a", start 0 none.
  EXPECT_EQ(Tokenizer::from_json(with("1")).decode(std::vector<int32_t>{0}), "");
  EXPECT_EQ(Tokenizer::from_json(with("0")).decode(std::vector<int32_t>{0}), "a");
}

// ------------------------------------------------------------------- config
// Finding (crafted input, ASan stack-overflow in fuzz_hf_config): the error
// for an unsupported hidden_act echoed the value with json::dump(), which
// recursed once per level of a 300,000-deep array. Only strings are echoed.
TEST(Regression, ConfigDeeplyNestedHiddenActIsAnError) {
  const int depth = 300000;
  const std::string cfg = R"({"model_type":"llama","hidden_act":)" + std::string(depth, '[') + std::string(depth, ']') + "}";
  expect_error([&] { parse_hf_config(cfg, "config.json"); }, "config.json: unsupported hidden_act of type array");
  expect_error([&] { parse_hf_config(R"({"model_type":"llama","hidden_act":"gelu"})", "config.json"); },
               "unsupported hidden_act \"gelu\" (supported: silu)");
}

// Finding (fuzz_hf_config, 197,579 runs in): "model_type": 1 made
// json::value<std::string> throw json::type_error, which escaped as a
// non-ptllm exception without the file name. Wrong-typed keys are now an
// Error naming the file.
TEST(Regression, ConfigWrongTypedKeysAreErrorsNamingTheFile) {
  expect_error([&] { parse_hf_config(R"({"model_type": 1, "vocab_size": 32000})", "cfg/config.json"); },
               "cfg/config.json: malformed config (");
  expect_error([&] {
    parse_hf_config(R"({"model_type":"llama","vocab_size":8,"hidden_size":8,"intermediate_size":8,)"
                    R"("num_hidden_layers":1,"num_attention_heads":2,"tie_word_embeddings":"yes"})",
                    "cfg/config.json");
  }, "cfg/config.json: malformed config (");
}

// --------------------------------------------------------------- safetensors
// Audit finding: add_file registered each tensor as it parsed the header, so
// when a later check failed (overlap, bad entry) the store kept views into the
// file that the throw had just unmapped; a caller that caught the error and
// went on would read freed memory. Now nothing is added unless all is valid.
TEST(Regression, SafetensorsFailedAddLeavesStoreUnchanged) {
  const std::string path = temp_path("overlap.safetensors");
  {
    // "a" is valid on its own; "b" overlaps it (checked after the loop).
    const std::string header =
        R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const uint64_t n = header.size();
    std::fwrite(&n, 8, 1, f);
    std::fwrite(header.data(), 1, header.size(), f);
    const float data[3] = {1, 2, 3};
    std::fwrite(data, sizeof data, 1, f);
    std::fclose(f);
  }
  TensorStore store;
  expect_error([&] { store.add_file(path); }, "tensors overlap");
  EXPECT_TRUE(store.all().empty());
  EXPECT_TRUE(store.metadata().empty());
  EXPECT_FALSE(store.has("a"));
  // The store is still usable.
  const std::string ok = temp_path("ok.safetensors");
  const float w[2] = {5, 6};
  write_safetensors(ok, {{"a", DType::F32, {2}, w}});
  store.add_file(ok);
  ASSERT_TRUE(store.has("a"));
  EXPECT_EQ(reinterpret_cast<const float*>(store.get("a").data)[1], 6.f);
  std::remove(path.c_str());
  std::remove(ok.c_str());
}

// Sharded checkpoints: the index may only name plain files in the folder, and
// every tensor it lists must be in the shard it names.
TEST(Regression, ShardedIndexRejectsPathsAndMissingTensors) {
  const std::string dir = temp_path("sharded");
  std::filesystem::create_directories(dir);
  const float w[2] = {1, 2};
  write_safetensors(dir + "/a.safetensors", {{"a", DType::F32, {2}, w}});
  auto index = [&](const std::string& body) {
    std::ofstream(dir + "/model.safetensors.index.json") << body;
  };
  index(R"({"weight_map":{"a":"../a.safetensors"}})");
  expect_error([&] { TensorStore::open_hf_dir(dir); }, "shard name ../a.safetensors must be a plain file name");
  index(R"({"weight_map":{"a":"a.safetensors","b":"a.safetensors"}})");
  expect_error([&] { TensorStore::open_hf_dir(dir); }, "tensor b listed in the index is missing from a.safetensors");
  index(R"({"weight_map":{"a":"nope.safetensors"}})");
  expect_error([&] { TensorStore::open_hf_dir(dir); }, "nope.safetensors: cannot open");
  // Finding (fuzz_safetensors_index in CI, 10,765 runs in): a shard name
  // holding a newline ("a.safet\nsors") reached the mmap "cannot open" error
  // as two lines. ptllm::Error now escapes control bytes in every message.
  index(R"({"weight_map":{"a":"a.safet\nsors"}})");
  expect_error([&] { TensorStore::open_hf_dir(dir); }, "a.safet\\nsors: cannot open");
  index(R"({"weight_map":[]})");
  expect_error([&] { TensorStore::open_hf_dir(dir); }, "expected a \"weight_map\" object");
  index(R"({"weight_map":{"a":"a.safetensors"}})");
  EXPECT_TRUE(TensorStore::open_hf_dir(dir).has("a"));
  std::filesystem::remove_all(dir);
}

// --------------------------------------------------------- non-finite logits
// A micro .tinygpt (vocab 8, d_model 4, one layer) whose embedding rows are
// NaN except token 1's, and whose output projection is zero: a prompt of
// token 1 gives all-zero logits, any other token NaN ones.
std::string nan_model(int V = 8) {
  const int D = 4, H = 2, KV = 1, HD = 2, F = 4;
  static std::vector<std::vector<float>> keep;
  auto t = [&](std::vector<float> v) {
    keep.push_back(std::move(v));
    return keep.back().data();
  };
  std::vector<float> emb(V * D, std::numeric_limits<float>::quiet_NaN());
  for (int d = 0; d < D; ++d) emb[1 * D + d] = 0.1f * float(d + 1);
  const nlohmann::json cfg = {{"arch", "tinygpt"}, {"vocab_size", V}, {"d_model", D}, {"n_layers", 1},
                              {"n_heads", H}, {"n_kv_heads", KV}, {"head_dim", HD}, {"ffn_dim", F},
                              {"context_length", 16}, {"rope_theta", 10000.0}, {"norm_eps", 1e-5},
                              {"tie_embeddings", false}, {"bos_token_id", 1}, {"eos_token_id", 2}};
  const std::vector<TensorToWrite> ts = {
      {"tok_embeddings.weight", DType::F32, {V, D}, t(emb)},
      {"norm.weight", DType::F32, {D}, t(std::vector<float>(D, 1.f))},
      {"output.weight", DType::F32, {V, D}, t(std::vector<float>(V * D, 0.f))},
      {"layers.0.attn_norm.weight", DType::F32, {D}, t(std::vector<float>(D, 1.f))},
      {"layers.0.attn.wq.weight", DType::F32, {H * HD, D}, t(std::vector<float>(H * HD * D, 0.1f))},
      {"layers.0.attn.wk.weight", DType::F32, {KV * HD, D}, t(std::vector<float>(KV * HD * D, 0.1f))},
      {"layers.0.attn.wv.weight", DType::F32, {KV * HD, D}, t(std::vector<float>(KV * HD * D, 0.1f))},
      {"layers.0.attn.wo.weight", DType::F32, {D, H * HD}, t(std::vector<float>(D * H * HD, 0.1f))},
      {"layers.0.ffn_norm.weight", DType::F32, {D}, t(std::vector<float>(D, 1.f))},
      {"layers.0.ffn.w_gate.weight", DType::F32, {F, D}, t(std::vector<float>(F * D, 0.1f))},
      {"layers.0.ffn.w_up.weight", DType::F32, {F, D}, t(std::vector<float>(F * D, 0.1f))},
      {"layers.0.ffn.w_down.weight", DType::F32, {D, F}, t(std::vector<float>(D * F, 0.1f))},
  };
  const std::string path = temp_path("nan.tinygpt");
  write_safetensors(path, ts, {{"format", "tinygpt"}, {"version", "1"}, {"config", cfg.dump()}});
  return path;
}

LoadedModel load(const std::string& path) {
  LoadedModel lm;
  lm.model = Model::load_tinygpt(path, nullptr);
  return lm;
}

// Engine hook: NaN/Inf logits must stop generation with a one-line error,
// never be sampled. Prefill: the NaN comes from the last prompt token.
TEST(Regression, NonFiniteLogitsAfterPrefillThrow) {
  const std::string path = nan_model();
  LoadedModel lm = load(path);
  Session s(lm, make_default_cache(*lm.model, 8));
  GenerateOptions go;
  go.max_new_tokens = 4;
  go.sampler.temperature = 0;
  expect_error([&] { s.generate({1, 3}, go, [](int32_t) { return true; }); }, "non-finite logits at position 1");
  std::remove(path.c_str());
}

// Decode: prompt token 1 gives finite (all-zero) logits; the greedy pick is
// then some token other than 1 (ties between equal logits never resolve to
// exactly token 1 on every step), whose NaN embedding poisons position 1.
TEST(Regression, NonFiniteLogitsDuringDecodeThrow) {
  const std::string path = nan_model();
  LoadedModel lm = load(path);
  Session s(lm, make_default_cache(*lm.model, 8));
  GenerateOptions go;
  go.max_new_tokens = 4;
  go.ignore_eos = true;
  go.sampler.temperature = 0;
  std::vector<int32_t> got;
  expect_error([&] { s.generate({1}, go, [&](int32_t id) { got.push_back(id); return true; }); },
               "non-finite logits at position 1");
  ASSERT_EQ(got.size(), 1u);  // the token sampled from the finite prefill logits
  EXPECT_NE(got[0], 1);
  std::remove(path.c_str());
}

// The batched decode step checks every sequence's row: the sequence fed token 3
// (NaN embedding) fails, whichever row it is, and a batch of finite rows passes.
// Vocabulary 8 (3 rows: one thread) and 16,384 (64 rows: B x V = 2^20 floats, where
// step_batch splits the rows across threads).
TEST(Regression, NonFiniteLogitsInABatchStepThrow) {
  for (const auto& [V, B] : {std::pair{8, 3}, std::pair{16384, 64}}) {
    SCOPED_TRACE(testing::Message() << "vocab " << V << ", batch " << B);
    const std::string path = nan_model(V);
    LoadedModel lm = load(path);
    const auto batch = [&](std::vector<std::unique_ptr<Decoder>>& ds) {
      std::vector<Decoder*> ptrs;
      for (int b = 0; b < B; ++b) {
        ds.push_back(std::make_unique<Decoder>(*lm.model, make_default_cache(*lm.model, 8)));
        ptrs.push_back(ds.back().get());
      }
      return ptrs;
    };
    for (int bad_row : {0, B / 2 + 1, B - 1}) {
      std::vector<std::unique_ptr<Decoder>> ds;
      const std::vector<Decoder*> ptrs = batch(ds);
      std::vector<int32_t> ids(size_t(B), 1);
      ids[size_t(bad_row)] = 3;
      expect_error([&] { step_batch(ptrs, ids); }, "non-finite logits at position 0");
    }
    std::vector<std::unique_ptr<Decoder>> ds;
    const std::vector<Decoder*> ptrs = batch(ds);
    step_batch(ptrs, std::vector<int32_t>(size_t(B), 1));
    for (const auto& d : ds) {
      ASSERT_EQ(d->logits(), std::vector<float>(size_t(V), 0.f));
      EXPECT_EQ(d->timing().decode_tokens, 1);
    }
    std::remove(path.c_str());
  }
}

// all_finite (the logits check) finds a NaN or an infinity at any place of a row,
// including the tail its vectorised loop leaves, and passes the extreme finite values.
TEST(Regression, AllFiniteFindsEveryNonFiniteValue) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::signaling_NaN()};
  const float good[] = {std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
                        std::numeric_limits<float>::denorm_min(), -0.f, 0.f};
  for (int64_t n : {1, 7, 16, 33, 1000}) {
    std::vector<float> x(size_t(n), 1.f);
    EXPECT_TRUE(all_finite(x.data(), n));
    for (int64_t p : {int64_t(0), n / 2, n - 1}) {
      for (float g : good) {
        x[size_t(p)] = g;
        EXPECT_TRUE(all_finite(x.data(), n)) << "n " << n << " at " << p << " value " << g;
      }
      for (float b : bad) {
        x[size_t(p)] = b;
        EXPECT_FALSE(all_finite(x.data(), n)) << "n " << n << " at " << p << " value " << b;
      }
      x[size_t(p)] = 1.f;
    }
  }
  EXPECT_TRUE(all_finite(nullptr, 0));
}

// The check does not fire on a healthy model (stories260K, 64 tokens).
TEST(Regression, FiniteLogitsPassTheCheck) {
  LoadedModel lm = load_model(PTLLM_REPO_DIR "/models/stories260K");
  Session s(lm, make_default_cache(*lm.model, 80));
  GenerateOptions go;
  go.max_new_tokens = 64;
  go.ignore_eos = true;
  go.sampler.seed = 1;
  const GenerateStats st = s.generate({1}, go, [](int32_t) { return true; });
  EXPECT_EQ(st.generated_tokens, 64);
  for (float v : s.last_logits()) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace ptllm
