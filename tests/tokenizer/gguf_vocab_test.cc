// GGUF-embedded tokenizers (tokenizer.ggml.*): llama.cpp's own test vectors
// for its vocabulary files, HF ids through vocabularies converted from
// tokenizer.json, decoding, streaming, the GGUF write/read round trip and
// load errors. Ids are integers: exact equality, no tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/gguf_file.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/impl.h"
#include "tokenizer/tokenizer.h"

using nlohmann::json;
using ptllm::GgufFile;
using ptllm::GgufVocab;
using ptllm::StreamDecoder;
using ptllm::Tokenizer;

namespace {

const std::string kShared = PTLLM_SHARED_DIR;
const std::string kVocab = kShared + "/anchors/llama.cpp/vocab/";
const std::string kFix = kShared + "/fixtures/tokenizers/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// llama.cpp's .inp: every text is followed by "\n__ggml_vocab_test__\n";
// .out: one line of space-separated ids per text.
struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};
std::vector<Vector> read_vectors(const std::string& stem) {
  const std::string inp = slurp(stem + ".inp"), out = slurp(stem + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Vector> v;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(sep, pos);
    if (end == std::string::npos) throw std::runtime_error(stem + ".inp: text without a separator");
    v.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  size_t k = 0;
  while (std::getline(lines, line)) {
    if (k >= v.size()) throw std::runtime_error(stem + ".out: more lines than texts");
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) v[k].ids.push_back(id);
    ++k;
  }
  if (k != v.size()) throw std::runtime_error(stem + ".out: fewer lines than texts");
  return v;
}

const Tokenizer& gguf_tok(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, ptllm::tokenizer_from_gguf(GgufFile(kVocab + name))).first;
  return it->second;
}

// A tokenizer.json turned into GGUF metadata and back into a tokenizer.
const Tokenizer& converted(const std::string& dir) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(dir);
  if (it == cache.end()) {
    const std::string cfg_path = dir + "/tokenizer_config.json";
    const std::string cfg = std::filesystem::exists(cfg_path) ? slurp(cfg_path) : "";
    const GgufVocab v = ptllm::gguf_vocab_from_hf(slurp(dir + "/tokenizer.json"), cfg, dir);
    it = cache.emplace(dir, ptllm::tokenizer_from_gguf_vocab(v, dir)).first;
  }
  return it->second;
}

std::string stream_all(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder d(t, skip);
  std::string s;
  for (int32_t id : ids) s += d.push(id);
  return s + d.flush();
}

void check_vectors(const Tokenizer& t, const std::string& stem, bool round_trip) {
  const std::vector<Vector> vs = read_vectors(stem);
  ASSERT_GT(vs.size(), 30u);
  for (const Vector& v : vs) {
    // The .out ids are llama.cpp's test-tokenizer-0 run: no BOS, no special parsing.
    EXPECT_EQ(t.encode(v.text, false, false), v.ids) << stem << " text: '" << v.text << "'";
    if (!round_trip) continue;
    EXPECT_EQ(t.decode(v.ids), v.text) << stem;
    EXPECT_EQ(stream_all(t, v.ids, true), t.decode(v.ids)) << stem;
  }
}

TEST(GgufVocab, LlamaSpmVectors) {
  check_vectors(gguf_tok("ggml-vocab-llama-spm.gguf"), kVocab + "ggml-vocab-llama-spm.gguf", true);
}
TEST(GgufVocab, Phi3Vectors) {
  check_vectors(gguf_tok("ggml-vocab-phi-3.gguf"), kVocab + "ggml-vocab-phi-3.gguf", true);
}
TEST(GgufVocab, Gpt2Vectors) {
  check_vectors(gguf_tok("ggml-vocab-gpt-2.gguf"), kVocab + "ggml-vocab-gpt-2.gguf", true);
}

// The llama-bpe and qwen2 vectors have no GGUF here: the same vocabularies
// come from the Llama 3 / Qwen3 tokenizer.json fixtures through the converter.
TEST(GgufVocab, LlamaBpeVectorsThroughConvertedLlama3) {
  check_vectors(converted(kFix + "llama3"), kVocab + "ggml-vocab-llama-bpe.gguf", false);
}
TEST(GgufVocab, Qwen2VectorsThroughConvertedQwen3) {
  check_vectors(converted(kFix + "qwen3"), kVocab + "ggml-vocab-qwen2.gguf", false);
}

// HF ids of every fixture case through the converted vocabularies
// (llama.cpp parses special tokens written in the text like HF does), except
// where llama.cpp itself differs from HF: `llama_cpp` gives its ids (checked
// with node-llama-cpp on the converted GGUF).
void check_cases(const Tokenizer& t, const std::string& dir,
                 const std::map<std::string, std::vector<int32_t>>& llama_cpp = {}) {
  const json doc = json::parse(slurp(dir + "/cases.json"));
  ASSERT_GT(doc.at("cases").size(), 10u);
  size_t overridden = 0;
  for (const json& c : doc["cases"]) {
    const std::string text = c.at("text").get<std::string>();
    auto want = c.at("ids_no_special").get<std::vector<int32_t>>();
    if (auto it = llama_cpp.find(text); it != llama_cpp.end()) {
      EXPECT_NE(want, it->second) << "not a deviation from HF: " << text;
      want = it->second;
      ++overridden;
    }
    EXPECT_EQ(t.encode(text, false, true), want) << dir << ": " << text;
  }
  EXPECT_EQ(overridden, llama_cpp.size());
}
TEST(GgufVocab, ConvertedLlama3MatchesHfCases) { check_cases(converted(kFix + "llama3"), kFix + "llama3"); }
TEST(GgufVocab, ConvertedQwen3MatchesHfCases) {
  // Qwen's "</s>" is an ordinary token, but llama.cpp forces every token
  // spelled "</s>" to be a control token, so with special parsing it is matched.
  check_cases(converted(kFix + "qwen3"), kFix + "qwen3",
              {{"<s> literal special </s>", {44047, 29, 23141, 3281, 220, 128247}}});
}
TEST(GgufVocab, ConvertedSpm32kMatchesHfCases) { check_cases(converted(kFix + "spm-bpe-32k"), kFix + "spm-bpe-32k"); }

TEST(GgufVocab, ConvertedFlagshipMatchesLlama2Vectors) {
  const Tokenizer& t = converted(kShared + "/models/flagship-27m");
  const json doc = json::parse(slurp(kFix + "llama2-vectors.json"));
  ASSERT_GT(doc.at("cases").size(), 10u);
  for (const json& c : doc["cases"]) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(t.encode(text, false, false), c.at("ids_no_special").get<std::vector<int32_t>>()) << text;
  }
}

// The converter's metadata for the flagship's tokenizer.json: the same tokens,
// types, ids and flags as llama.cpp's converter wrote into the shipped GGUF.
TEST(GgufVocab, ConvertedFlagshipMetadataMatchesLlamaCpp) {
  const std::string dir = kShared + "/models/flagship-27m";
  const GgufVocab ours = ptllm::gguf_vocab_from_hf(slurp(dir + "/tokenizer.json"),
                                                  slurp(dir + "/tokenizer_config.json"), dir);
  const GgufVocab ref = ptllm::read_gguf_vocab(GgufFile(kShared + "/models/flagship-27m-gguf/flagship-q8_0.gguf"));
  EXPECT_EQ(ours.model, ref.model);
  EXPECT_EQ(ours.tokens, ref.tokens);
  EXPECT_EQ(ours.token_type, ref.token_type);
  EXPECT_EQ(ours.bos, ref.bos);
  EXPECT_EQ(ours.eos, ref.eos);
  EXPECT_EQ(ours.unk, ref.unk);
  EXPECT_EQ(ours.add_bos, ref.add_bos);
  EXPECT_EQ(ours.add_eos, ref.add_eos);
}

// write_gguf_tokenizer -> GGUF file -> tokenizer_from_gguf gives the HF ids.
TEST(GgufVocab, WriteReadRoundTrip) {
  for (const std::string& dir : {kFix + "gpt2", kFix + "spm-bpe-32k"}) {
    const std::string cfg_path = dir + "/tokenizer_config.json";
    const std::string cfg = std::filesystem::exists(cfg_path) ? slurp(cfg_path) : "";
    ptllm::GgufWriter w;
    w.set_string("general.architecture", "llama");
    ptllm::write_gguf_tokenizer(slurp(dir + "/tokenizer.json"), cfg, w);
    const std::string path = testing::TempDir() + "/vocab_roundtrip.gguf";
    w.write(path);
    const Tokenizer back = ptllm::tokenizer_from_gguf(GgufFile(path));
    const Tokenizer hf = Tokenizer::from_json(slurp(dir + "/tokenizer.json"), cfg);
    EXPECT_EQ(back.vocab_size(), hf.vocab_size());
    for (const char* text : {"Hello world", " leading space", "numbers 12345 and ünïcödé", "tabs\tand\nnewlines  "})
      EXPECT_EQ(back.encode(text, false, false), hf.encode(text, false)) << dir << ": " << text;
    std::filesystem::remove(path);
  }
}

// The SentencePiece cut (LlamaVocab::spm_cut) is exact: a book, the vectors
// and odd whitespace give the same ids with the whole text merged at once.
TEST(GgufVocab, SpmCutIsExact) {
  for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"}) {
    const Tokenizer& t = gguf_tok(name);
    auto& lv = const_cast<ptllm::tok_detail::LlamaVocab&>(*t.impl().llama);
    ASSERT_TRUE(lv.spm_cut) << name;
    std::vector<std::string> texts = {slurp(kShared + "/corpus/heldout/carroll__alice_s_adventures_in_wonderland.txt")};
    for (const Vector& v : read_vectors(kVocab + name)) texts.push_back(v.text);
    texts.push_back("a \u2581b\u2581\u2581 c  \u2581 ▁x▁▁y ▁");
    for (const std::string& text : texts) {
      lv.spm_cut = true;
      const auto cut = t.encode(text, true, true);
      lv.spm_cut = false;
      const auto whole = t.encode(text, true, true);
      lv.spm_cut = true;
      EXPECT_EQ(cut, whole) << name << ": " << text.substr(0, 80);
    }
  }
}

TEST(GgufVocab, SpecialTokens) {
  const Tokenizer& phi = gguf_tok("ggml-vocab-phi-3.gguf");
  // Control tokens are matched only when parsing specials; Phi-3's swallow
  // the whitespace after them (llama.cpp's rstrip for that model).
  const auto ids = phi.encode("<|user|>\nHi<|end|>", false, true);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 32010);
  EXPECT_EQ(ids.back(), 32007);
  EXPECT_EQ(phi.encode("<|user|>\nHi<|end|>", false, true), phi.encode("<|user|>Hi<|end|>", false, true));
  const auto plain = phi.encode("<|user|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 32010), 0);
  // "</s>" is user-defined in this file, but llama.cpp treats it as control
  // (checked against llama.cpp by vocab_anchor.mjs): matched only when parsing specials.
  EXPECT_EQ(phi.encode("a</s>", false, true), (std::vector<int32_t>{263, 2}));
  EXPECT_EQ(phi.encode("a</s>", false, false), (std::vector<int32_t>{263, 829, 29879, 29958}));
  // BOS per tokenizer.ggml.add_bos_token.
  EXPECT_EQ(phi.encode("a", true, true).front(), 1);
  EXPECT_EQ(gguf_tok("ggml-vocab-gpt-2.gguf").encode("a", true, true), gguf_tok("ggml-vocab-gpt-2.gguf").encode("a", false, true));
  const Tokenizer& gpt2 = gguf_tok("ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(gpt2.encode("x<|endoftext|>", false, true).back(), 50256);
  EXPECT_NE(gpt2.encode("x<|endoftext|>", false, false).back(), 50256);
  // Decoding drops control tokens unless asked to keep them.
  EXPECT_EQ(phi.decode(std::vector<int32_t>{1, 32010, 15043}), "Hello");
  EXPECT_EQ(phi.decode(std::vector<int32_t>{32010, 15043}, false), "<|user|> Hello");
}

TEST(GgufVocab, ByteFallbackDecodeAndStreaming) {
  const Tokenizer& t = gguf_tok("ggml-vocab-llama-spm.gguf");
  // "€" is not a token: its three bytes come out as <0xE2><0x82><0xAC>.
  const auto ids = t.encode("a€b\xF0\x9F\x98\x80", false, false);
  EXPECT_EQ(t.decode(ids), "a€b\xF0\x9F\x98\x80");
  StreamDecoder d(t);
  std::string got;
  for (int32_t id : ids) {
    const std::string piece = d.push(id);
    // Never half a character.
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos);
    got += piece;
  }
  got += d.flush();
  EXPECT_EQ(got, "a€b\xF0\x9F\x98\x80");
  // A lone byte token decodes to U+FFFD.
  EXPECT_EQ(t.decode(std::vector<int32_t>{*t.token_to_id("<0xE2>")}), "\xEF\xBF\xBD");
  EXPECT_THROW(t.decode(std::vector<int32_t>{32000}), ptllm::Error);
}

TEST(GgufVocab, LoadErrors) {
  GgufVocab v;
  v.model = "llama";
  EXPECT_THROW(ptllm::tokenizer_from_gguf_vocab(v, "x"), ptllm::Error);  // no tokens
  v.tokens = {"<unk>", "<s>", "</s>", "a"};
  v.scores = {0, 0};
  EXPECT_THROW(ptllm::tokenizer_from_gguf_vocab(v, "x"), ptllm::Error);  // scores length
  v.scores.clear();
  v.model = "bert";
  try {
    ptllm::tokenizer_from_gguf_vocab(v, "x.gguf");
    FAIL() << "expected an error";
  } catch (const ptllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model 'bert'"), std::string::npos) << e.what();
  }
  v.model = "gpt2";
  v.pre = "no-such-pre";
  try {
    ptllm::tokenizer_from_gguf_vocab(v, "x.gguf");
    FAIL() << "expected an error";
  } catch (const ptllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.pre 'no-such-pre'"), std::string::npos) << e.what();
  }
  v.model = "llama";
  v.scores = {0, 0, std::nanf(""), 0};
  EXPECT_THROW(ptllm::tokenizer_from_gguf_vocab(v, "x.gguf"), ptllm::Error);  // NaN score
  v.scores.clear();
  v.model = "gpt2";
  v.pre = "gpt-2";
  v.merges = {"a b"};
  EXPECT_THROW(ptllm::tokenizer_from_gguf_vocab(v, "x.gguf"), ptllm::Error);  // merge of unknown tokens
  // tokenizer.json that llama.cpp has no pre-tokenizer for, or no byte fallback / byte level.
  const std::string odd_pre = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "Isolated"},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})";
  try {
    ptllm::gguf_vocab_from_hf(odd_pre, "", "odd.json");
    FAIL() << "expected an error";
  } catch (const ptllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("matches none of the llama.cpp pre-tokenizers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ptllm::gguf_vocab_from_hf(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})", "", "x"),
               ptllm::Error);
  // A GGUF without tokenizer metadata.
  ptllm::GgufWriter w;
  w.set_string("general.architecture", "llama");
  const std::string path = testing::TempDir() + "/no_vocab.gguf";
  w.write(path);
  EXPECT_THROW(ptllm::tokenizer_from_gguf(GgufFile(path)), ptllm::Error);
  std::filesystem::remove(path);
}

// `tokenize` on a .gguf: same flags and JSON as for tokenizer.json.
std::string run_cli(const std::string& args, int* status) {
  const std::string cmd = std::string(PTLLM_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(GgufVocab, TokenizeCommand) {
  const std::string spm = kVocab + "ggml-vocab-llama-spm.gguf";
  int st = 0;
  json j = json::parse(run_cli("tokenize " + spm + " --text 'Hello world' --json", &st));
  EXPECT_EQ(st, 0);
  EXPECT_EQ(j.at("ids"), json({1, 15043, 3186}));
  EXPECT_EQ(j.at("pieces"), json({"<s>", "\u2581Hello", "\u2581world"}));
  j = json::parse(run_cli("tokenize " + spm + " --text 'Hello world</s>' --no-special --json", &st));
  EXPECT_EQ(j.at("ids"), json({15043, 3186, 829, 29879, 29958}));  // no BOS, "</s>" as text
  j = json::parse(run_cli("tokenize " + spm + " --text 'Hello world</s>' --json", &st));
  EXPECT_EQ(j.at("ids"), json({1, 15043, 3186, 2}));
  j = json::parse(run_cli("tokenize " + kVocab + "ggml-vocab-gpt-2.gguf --decode 15496,995 --json", &st));
  EXPECT_EQ(j.at("text"), "Hello world");
  // A GGUF without a vocabulary: one error line naming the file and key.
  ptllm::GgufWriter w;
  w.set_string("general.architecture", "llama");
  const std::string path = testing::TempDir() + "/cli_no_vocab.gguf";
  w.write(path);
  const std::string err = run_cli("tokenize " + path + " --text hi", &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(err.find("tokenizer.ggml.model"), std::string::npos) << err;
  std::filesystem::remove(path);
}

}  // namespace
