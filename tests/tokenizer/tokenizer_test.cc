// Exactness tests against Hugging Face `tokenizers` outputs stored in
// shared/fixtures, plus streaming-decoder, load-error and invalid-UTF-8 tests.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <sstream>

#include "core/error.h"
#include "tokenizer/impl.h"
#include "tokenizer/tokenizer.h"

using nlohmann::json;
using ptllm::StreamDecoder;
using ptllm::Tokenizer;

namespace {

const std::string kShared = PTLLM_SHARED_DIR;
const std::string kFix = kShared + "/fixtures/tokenizers/";

json load_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return json::parse(f);
}

// Tokenizers are expensive to load (the Llama 3 / Qwen3 files are 9-11 MB),
// so each is loaded once for the whole test binary.
const Tokenizer& tok(const std::string& path) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(path);
  if (it == cache.end()) it = cache.emplace(path, Tokenizer::from_file(path)).first;
  return it->second;
}

const Tokenizer& llama3() { return tok(kFix + "llama3/tokenizer.json"); }
const Tokenizer& qwen3() { return tok(kFix + "qwen3/tokenizer.json"); }
const Tokenizer& spm32k() { return tok(kFix + "spm-bpe-32k/tokenizer.json"); }
const Tokenizer& gpt2() { return tok(kFix + "gpt2/tokenizer.json"); }
const Tokenizer& llama2() { return tok(kShared + "/models/flagship-27m/tokenizer.json"); }
const Tokenizer& stories() { return tok(kShared + "/models/stories260K/tokenizer.json"); }

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

std::string show(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out.push_back(char(c));
  }
  return out.size() > 120 ? out.substr(0, 120) + "..." : out;
}

void check_cases(const Tokenizer& t, const std::string& cases_path) {
  const json doc = load_json(cases_path);
  ASSERT_GT(doc.at("cases").size(), 0u);
  int n = 0;
  for (const json& c : doc["cases"]) {
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE("text: \"" + show(text) + "\"");
    EXPECT_EQ(t.encode(text, true), ids_of(c.at("ids")));
    const auto no_special = ids_of(c.at("ids_no_special"));
    EXPECT_EQ(t.encode(text, false), no_special);
    // `decoded` was produced with skip_special_tokens=False (special tokens
    // written in the text survive the round trip).
    EXPECT_EQ(t.decode(no_special, false), c.at("decoded").get<std::string>());
    ++n;
  }
  EXPECT_GE(n, 60);
}

void check_vectors(const Tokenizer& t, const std::string& path, bool roundtrip) {
  const json doc = load_json(path);
  ASSERT_GT(doc.at("cases").size(), 0u);
  for (const json& c : doc["cases"]) {
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE("text: \"" + show(text) + "\"");
    const auto want = ids_of(c.at("ids_no_special"));
    EXPECT_EQ(t.encode(text, false), want);
    if (roundtrip) {
      EXPECT_EQ(t.decode(want, true), text);
    }
  }
}

}  // namespace

// ------------------------------------------------------------- exactness
// utf8_valid's first_bad / truncated, on byte strings whose answers follow from UTF-8's
// definition (RFC 3629): "é" is C3 A9, "€" is E2 82 AC; C3 alone is a 2-byte character's start;
// 80 is a continuation byte with no lead; C0 never starts a character.
TEST(Utf8Valid, FirstBadAndTruncated) {
  struct Case {
    std::string bytes;
    bool valid;
    size_t first_bad;
    bool truncated;
  };
  const Case cases[] = {
      {"a\xC3\xA9\xE2\x82\xAC", true, 0, false},
      {"a\xC3", false, 1, true},
      {"\xC3\xA9\xE2\x82", false, 2, true},
      {"a\x80", false, 1, false},
      {"\xE2\x82 ", false, 0, false},  // cut off by a space: ill-formed, not waiting
      {"\xC0\x80", false, 0, false},
      {"\xF0\x9F\x98", false, 0, true},
  };
  for (const Case& c : cases) {
    size_t first_bad = 99;
    bool truncated = true;
    EXPECT_EQ(ptllm::tok_detail::utf8_valid(c.bytes, &first_bad, &truncated), c.valid) << c.bytes;
    if (!c.valid) {
      EXPECT_EQ(first_bad, c.first_bad) << c.bytes;
    }
    EXPECT_EQ(truncated, c.truncated) << c.bytes;
  }
}

TEST(TokenizerCases, Llama3) { check_cases(llama3(), kFix + "llama3/cases.json"); }
TEST(TokenizerCases, Qwen3) { check_cases(qwen3(), kFix + "qwen3/cases.json"); }
TEST(TokenizerCases, SpmBpe32k) { check_cases(spm32k(), kFix + "spm-bpe-32k/cases.json"); }
TEST(TokenizerVectors, Llama2Flagship) { check_vectors(llama2(), kFix + "llama2-vectors.json", false); }
TEST(TokenizerVectors, Gpt2) { check_vectors(gpt2(), kFix + "gpt2/vectors.json", true); }

TEST(TokenizerModels, Stories260KRoundTrip) {
  const Tokenizer& t = stories();
  EXPECT_EQ(t.vocab_size(), 512);
  const std::string text = "Once upon a time";
  const auto ids = t.encode(text);
  ASSERT_FALSE(ids.empty());
  ASSERT_TRUE(t.bos_id().has_value());
  EXPECT_EQ(ids.front(), *t.bos_id());
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.encode(text, false), std::vector<int32_t>(ids.begin() + 1, ids.end()));
}

TEST(TokenizerModels, SpecialIdsAndLookups) {
  EXPECT_EQ(llama2().bos_id(), 1);
  EXPECT_EQ(llama2().eos_id(), 2);
  EXPECT_EQ(llama2().vocab_size(), 32000);
  EXPECT_EQ(llama2().token_to_id("<0x0A>"), 13);
  EXPECT_EQ(llama2().id_to_piece(13), "<0x0A>");
  EXPECT_EQ(llama3().bos_id(), 128000);
  EXPECT_EQ(llama3().eos_id(), 128001);
  EXPECT_EQ(llama3().vocab_size(), 128256);
  EXPECT_FALSE(qwen3().bos_id().has_value());  // tokenizer_config.json: bos_token null
  EXPECT_EQ(qwen3().eos_id(), qwen3().token_to_id("<|im_end|>"));
  EXPECT_EQ(qwen3().vocab_size(), 151669);
  EXPECT_FALSE(llama3().token_to_id("definitely not a token").has_value());
  EXPECT_THROW(llama2().id_to_piece(32000), ptllm::Error);
  EXPECT_THROW(llama2().id_to_piece(-1), ptllm::Error);
  const std::vector<int32_t> bad = {5, 99999};
  EXPECT_THROW(llama2().decode(bad), ptllm::Error);
}

TEST(TokenizerModels, SkipSpecialTokensOnDecode) {
  const auto ids = llama3().encode("<|begin_of_text|>Hi<|eot_id|>", false);
  EXPECT_EQ(llama3().decode(ids, false), "<|begin_of_text|>Hi<|eot_id|>");
  EXPECT_EQ(llama3().decode(ids, true), "Hi");
  const auto sp = llama2().encode("Hello world", true);
  EXPECT_EQ(sp.front(), 1);
  EXPECT_EQ(llama2().decode(sp, true), "Hello world");
  EXPECT_EQ(llama2().decode(sp, false), "<s> Hello world");
}

TEST(TokenizerModels, TokenizerIsCheapToCopyAndMove) {
  Tokenizer a = llama2();
  Tokenizer b = std::move(a);
  EXPECT_EQ(b.encode("Hello world", false), (std::vector<int32_t>{15043, 3186}));
}

// ------------------------------------------------------------- streaming
namespace {
bool valid_utf8(const std::string& s) { return ptllm::tok_detail::utf8_valid(s); }

void check_stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder sd(t, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = sd.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "partial UTF-8 emitted for id " << id;
    all += piece;
  }
  const std::string tail = sd.flush();
  EXPECT_TRUE(valid_utf8(tail));
  all += tail;
  EXPECT_EQ(all, t.decode(ids, skip));
}
}  // namespace

TEST(StreamDecoder, ConcatEqualsFullDecodeOnCases) {
  for (const char* name : {"llama3", "qwen3", "spm-bpe-32k"}) {
    const Tokenizer& t = tok(kFix + name + "/tokenizer.json");
    const json doc = load_json(kFix + name + "/cases.json");
    for (const json& c : doc["cases"]) {
      SCOPED_TRACE(std::string(name) + ": " + show(c["text"].get<std::string>()));
      const auto ids = ids_of(c["ids"]);
      check_stream(t, ids, true);
      check_stream(t, ids, false);
    }
  }
}

TEST(StreamDecoder, ByteFallbackPiecesAreHeldUntilComplete) {
  const Tokenizer& t = llama2();
  // "🦙" is not in the Llama 2 vocabulary: 4 byte-fallback pieces.
  const auto ids = t.encode(" this is 🦙.cpp", false);
  StreamDecoder sd(t);
  std::string all;
  for (int32_t id : ids) {
    const std::string s = sd.push(id);
    // no U+FFFD and never a piece of the 4-byte emoji
    EXPECT_EQ(s.find("\xEF\xBF\xBD"), std::string::npos);
    EXPECT_TRUE(valid_utf8(s));
    if (t.id_to_piece(id).rfind("<0x", 0) == 0) {
      EXPECT_EQ(s, "");
    }
    all += s;
  }
  all += sd.flush();
  EXPECT_EQ(all, " this is 🦙.cpp");
  // The emoji's bytes alone, then flush.
  StreamDecoder sd2(t);
  std::string out;
  for (const char* p : {"<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"}) out += sd2.push(*t.token_to_id(p));
  EXPECT_EQ(out, "");
  EXPECT_EQ(sd2.flush(), "🦙");
}

TEST(StreamDecoder, ByteLevelMultiByteCharacters) {
  const Tokenizer& t = gpt2();
  const std::string text = "нещо на Български 🦙 日本語";
  const auto ids = t.encode(text, false);
  StreamDecoder sd(t);
  std::string all;
  for (int32_t id : ids) {
    const std::string s = sd.push(id);
    EXPECT_TRUE(valid_utf8(s));
    EXPECT_EQ(s.find("\xEF\xBF\xBD"), std::string::npos);
    all += s;
  }
  EXPECT_EQ(all, text);  // everything is complete before flush
  EXPECT_EQ(sd.flush(), "");
}

TEST(StreamDecoder, RandomIdSequencesMatchFullDecode) {
  std::mt19937 rng(1234);
  for (const Tokenizer* t : {&llama2(), &llama3(), &qwen3(), &gpt2()}) {
    std::uniform_int_distribution<int32_t> any(0, t->vocab_size() - 1);
    std::uniform_int_distribution<int32_t> low(0, 300);  // byte pieces / byte-level singles
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<int32_t> ids;
      for (int k = 0; k < 30; ++k) {
        const int32_t id = (rng() % 2) ? low(rng) : any(rng);
        if (t->impl().piece(id)) ids.push_back(id);
      }
      check_stream(*t, ids, trial % 2 == 0);
    }
  }
}

// ByteRuns::Eager (the server's): a byte-fallback run goes out a whole character at a
// time, as llama-server's validate_utf8 sends it. Expected texts written by hand from HF's
// ByteFallback rule (a run valid as a whole is its text, else one U+FFFD per byte).
TEST(StreamDecoder, EagerByteRunsSendWholeCharactersAtOnce) {
  const Tokenizer& t = llama2();
  const auto id = [&](const char* p) { return *t.token_to_id(p); };
  const std::string fffd = "\xEF\xBF\xBD";
  {  // A newline byte goes out at its own push; the quote's bytes at its last one.
    StreamDecoder sd(t, true, ptllm::ByteRuns::Eager);
    std::vector<std::string> got;
    for (int32_t i : {id("\xE2\x96\x81Hello"), id("<0x0A>"), id("<0xE2>"), id("<0x80>"), id("<0x9C>"),
                      id("\xE2\x96\x81world")})
      got.push_back(sd.push(i));
    EXPECT_EQ(got, (std::vector<std::string>{"Hello", "\n", "", "", "\xE2\x80\x9C", " world"}));
    EXPECT_EQ(sd.flush(), "");
  }
  {  // Whole (the default) holds the newline until the run ends; the same text in the end.
    StreamDecoder sd(t);
    std::vector<std::string> got;
    for (int32_t i : {id("\xE2\x96\x81Hello"), id("<0x0A>"), id("\xE2\x96\x81world")}) got.push_back(sd.push(i));
    EXPECT_EQ(got, (std::vector<std::string>{"Hello", "", "\n world"}));
  }
  {  // A run that turns invalid after its newline went out: the newline stays, the rest is
     // U+FFFD per byte (decode(): U+FFFD for all three).
    const std::vector<int32_t> ids = {id("\xE2\x96\x81Hello"), id("<0x0A>"), id("<0xE2>"), id("<0x80>"),
                                      id("\xE2\x96\x81world")};
    EXPECT_EQ(t.decode(ids, true), "Hello" + fffd + fffd + fffd + " world");
    StreamDecoder sd(t, true, ptllm::ByteRuns::Eager);
    std::string all;
    for (int32_t i : ids) all += sd.push(i);
    all += sd.flush();
    EXPECT_EQ(all, "Hello\n" + fffd + fffd + " world");
  }
  {  // ... and at the end of the stream; a byte that cannot continue a character breaks
     // the run at once (nothing more of it goes out).
    StreamDecoder sd(t, true, ptllm::ByteRuns::Eager);
    std::string all;
    for (int32_t i : {id("<0x41>"), id("<0xE2>")}) all += sd.push(i);
    EXPECT_EQ(all, "A");
    EXPECT_EQ(sd.flush(), fffd);
    all.clear();
    for (int32_t i : {id("<0x41>"), id("<0xE2>"), id("<0x42>"), id("<0x43>")}) all += sd.push(i);
    EXPECT_EQ(all, "A");
    EXPECT_EQ(sd.flush(), fffd + fffd + fffd);
    // A fresh stream after flush: nothing carried over.
    EXPECT_EQ(sd.push(id("<0x0A>")), "\n");
    EXPECT_EQ(sd.flush(), "");
  }
  {  // A run that breaks before anything of it went out is decode()'s; the next run is eager again.
    StreamDecoder sd(t, true, ptllm::ByteRuns::Eager);
    std::vector<std::string> got;
    for (int32_t i : {id("\xE2\x96\x81Hello"), id("<0xE2>"), id("<0x41>"), id("\xE2\x96\x81world"), id("<0x0A>")})
      got.push_back(sd.push(i));
    EXPECT_EQ(got, (std::vector<std::string>{"Hello", "", "", fffd + fffd + " world", "\n"}));
    EXPECT_EQ(sd.flush(), "");
  }
}

// Eager on random ids: every piece valid UTF-8, and the text equal to decode() wherever
// no byte run is invalid as a whole (decode() then has no U+FFFD from a run).
TEST(StreamDecoder, EagerByteRunsMatchDecodeWhereRunsAreValid) {
  std::mt19937 rng(4321);
  int compared = 0;
  for (const Tokenizer* t : {&llama2(), &llama3(), &qwen3(), &gpt2()}) {
    std::uniform_int_distribution<int32_t> any(0, t->vocab_size() - 1);
    // ASCII single bytes: llama2's <0x00>..<0x7F> are ids 3..130, the byte-level ones' '!'..'~' 0..93.
    std::uniform_int_distribution<int32_t> low(t == &llama2() ? 3 : 0, t == &llama2() ? 130 : 93);
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<int32_t> ids;
      for (int k = 0; k < 30; ++k) {
        const int32_t id = (rng() % 4) ? low(rng) : any(rng);
        if (t->impl().piece(id)) ids.push_back(id);
      }
      if (trial % 3 == 0) {  // valid runs too: a newline and a quote's bytes spliced in
        std::vector<int32_t> run;
        for (const char* p : {"<0x0A>", "<0xE2>", "<0x80>", "<0x9C>"})
          if (auto b = t->token_to_id(p)) run.push_back(*b);
        ids.insert(ids.begin() + long(ids.size() / 2), run.begin(), run.end());
      }
      StreamDecoder sd(*t, true, ptllm::ByteRuns::Eager);
      std::string all;
      for (int32_t id : ids) {
        const std::string piece = sd.push(id);
        EXPECT_TRUE(valid_utf8(piece));
        all += piece;
      }
      all += sd.flush();
      EXPECT_TRUE(valid_utf8(all));
      const std::string whole = t->decode(ids, true);
      if (whole.find("\xEF\xBF\xBD") == std::string::npos) {
        EXPECT_EQ(all, whole);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 150);  // of 240 (224 when written): the rest hold a run decode() makes U+FFFD
}

TEST(StreamDecoder, FlushResetsForANewStream) {
  const Tokenizer& t = llama2();
  const auto ids = t.encode("Hello world", true);
  StreamDecoder sd(t);
  std::string a;
  for (int32_t id : ids) a += sd.push(id);
  a += sd.flush();
  std::string b;
  for (int32_t id : ids) b += sd.push(id);
  b += sd.flush();
  EXPECT_EQ(a, "Hello world");
  EXPECT_EQ(b, "Hello world");
}

// ----------------------------------------------------------- load errors
namespace {
// A tiny valid BPE tokenizer.json that individual tests break.
json tiny() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}
  })");
}

std::string load_error(const json& j) {
  try {
    Tokenizer::from_json(j.dump());
  } catch (const ptllm::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TokenizerLoad, TinyBpeWorks) {
  const Tokenizer t = Tokenizer::from_json(tiny().dump());
  EXPECT_EQ(t.encode("abba"), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(t.encode("aab"), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{2, 1}), "ab b");  // no decoder: HF joins with spaces
}

TEST(TokenizerLoad, UnsupportedComponentsNameThemselvesAndTheSupportedOnes) {
  json j = tiny();
  j["model"]["type"] = "WordPiece";
  std::string e = load_error(j);
  EXPECT_NE(e.find("WordPiece"), std::string::npos) << e;
  EXPECT_NE(e.find("supported: BPE"), std::string::npos) << e;

  j = tiny();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  e = load_error(j);
  EXPECT_NE(e.find("normalizer 'BertNormalizer'"), std::string::npos) << e;
  EXPECT_NE(e.find("NFC"), std::string::npos) << e;

  j = tiny();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  e = load_error(j);
  EXPECT_NE(e.find("pre_tokenizer 'BertPreTokenizer'"), std::string::npos) << e;
  EXPECT_NE(e.find("ByteLevel"), std::string::npos) << e;

  j = tiny();
  j["decoder"] = {{"type", "WordPiece"}};
  e = load_error(j);
  EXPECT_NE(e.find("decoder 'WordPiece'"), std::string::npos) << e;
  EXPECT_NE(e.find("ByteFallback"), std::string::npos) << e;

  j = tiny();
  j["post_processor"] = {{"type", "Frobnicate"}};
  e = load_error(j);
  EXPECT_NE(e.find("post_processor 'Frobnicate'"), std::string::npos) << e;
  EXPECT_NE(e.find("TemplateProcessing"), std::string::npos) << e;

  j = tiny();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}, {{"type", "Nope"}}}}};
  e = load_error(j);
  EXPECT_NE(e.find("'Nope'"), std::string::npos) << e;
}

TEST(TokenizerLoad, MalformedInputsAreErrors) {
  EXPECT_NE(load_error(json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a x"]}})"))
                .find("merge #0"),
            std::string::npos);
  json j = tiny();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(load_error(j).find("regex"), std::string::npos);
  EXPECT_THROW(Tokenizer::from_json("{not json"), ptllm::Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), ptllm::Error);
  try {
    Tokenizer::from_file("/nonexistent/tokenizer.json");
  } catch (const ptllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

// ------------------------------------------------------------ invalid UTF-8
TEST(TokenizerUtf8, ByteFallbackEncodesInvalidBytes) {
  const Tokenizer& t = llama2();
  const auto ids = t.encode(std::string("a\xFF" "b"), false);
  const int32_t ff = *t.token_to_id("<0xFF>");
  EXPECT_NE(std::find(ids.begin(), ids.end(), ff), ids.end());
  EXPECT_EQ(t.decode(ids), "a\xEF\xBF\xBD" "b");  // the lone byte decodes to U+FFFD
}

TEST(TokenizerUtf8, ByteLevelEncodesInvalidBytes) {
  const Tokenizer& t = gpt2();
  const auto ids = t.encode(std::string("x\xC3"), false);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(t.decode(ids), "x\xEF\xBF\xBD");
}

TEST(TokenizerUtf8, RejectedWithoutByteFallback) {
  const Tokenizer t = Tokenizer::from_json(tiny().dump());
  try {
    t.encode(std::string("ab\xE2\x82"));
    FAIL() << "expected ptllm::Error";
  } catch (const ptllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte offset 2"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------- pre-tokenizer semantics
TEST(TokenizerComponents, SplitBehaviorsAndDigits) {
  using namespace ptllm::tok_detail;
  auto run = [](const json& pt, const std::string& text) {
    json j = tiny();
    j["pre_tokenizer"] = pt;
    // Each character is its own token id via a byte-level-free vocab: we only
    // inspect the pre-tokenizer here.
    auto impl = load_impl(j.dump(), "", "test");
    std::vector<Piece> pieces{Piece{text, true}};
    impl->pre_tokenizer->apply(pieces);
    std::vector<std::string> out;
    for (auto& p : pieces) out.push_back(p.text);
    return out;
  };
  using V = std::vector<std::string>;
  json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}};
  EXPECT_EQ(run(split, "a-b--c"), (V{"a", "b", "c"}));
  split["behavior"] = "Isolated";
  EXPECT_EQ(run(split, "a-b--c"), (V{"a", "-", "b", "-", "-", "c"}));
  split["behavior"] = "MergedWithPrevious";
  EXPECT_EQ(run(split, "a-b--c"), (V{"a-", "b-", "-", "c"}));
  split["behavior"] = "MergedWithNext";
  EXPECT_EQ(run(split, "a-b--c"), (V{"a", "-b", "-", "-c"}));
  split["behavior"] = "Contiguous";
  EXPECT_EQ(run(split, "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(run({{"type", "Digits"}, {"individual_digits", true}}, "ab123c"), (V{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(run({{"type", "Digits"}, {"individual_digits", false}}, "ab123c4"), (V{"ab", "123", "c", "4"}));
  EXPECT_EQ(run({{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}},
                "Hey friend"),
            (V{"\xE2\x96\x81Hey", "\xE2\x96\x81" "friend"}));
}

// ------------------------------------------------------ added-token flags
TEST(TokenizerComponents, AddedTokenStripAndSingleWord) {
  json j = tiny();
  j["model"]["vocab"] = {{"a", 0}, {"b", 1}, {"ab", 2}, {" ", 3}};
  j["added_tokens"] = json::parse(R"([
    {"id": 4, "content": "<x>", "lstrip": true, "rstrip": true, "single_word": false, "normalized": false, "special": true},
    {"id": 5, "content": "ab", "lstrip": false, "rstrip": false, "single_word": true, "normalized": false, "special": false}
  ])");
  const Tokenizer t = Tokenizer::from_json(j.dump());
  using V = std::vector<int32_t>;
  EXPECT_EQ(t.encode("a <x> b"), (V{0, 4, 1}));       // the spaces around <x> are absorbed
  EXPECT_EQ(t.encode("a<x>b"), (V{0, 4, 1}));
  EXPECT_EQ(t.encode("ab ab"), (V{5, 3, 5}));         // whole words: the added token
  EXPECT_EQ(t.encode("aab"), (V{0, 2}));              // inside a word: ordinary BPE
  EXPECT_EQ(t.encode("ab<x>"), (V{5, 4}));            // '<' is not a word character
  EXPECT_EQ(t.decode(V{0, 4, 1}, false), "a <x> b");  // no decoder: pieces joined by spaces
  EXPECT_EQ(t.decode(V{0, 4, 1}, true), "a b");
  EXPECT_TRUE(t.is_special(4));
  EXPECT_FALSE(t.is_special(5));
}

TEST(TokenizerComponents, ConcurrentEncodeIsSafe) {
  const Tokenizer& t = llama3();
  const std::string text = "The quick brown fox jumps over the lazy dog. 1234567 ½ café 🦙\n";
  std::string big;
  for (int k = 0; k < 200; ++k) big += text + std::to_string(k) + " ";
  const auto want = t.encode(big);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 5; ++r) ok[size_t(k)] += t.encode(big) == want;
    });
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_EQ(v, 5);
}

TEST(TokenizerComponents, LongWordsAreHandled) {
  // One 200 kB "word": exercises the heap-based merge on a long symbol list
  // (no pre-tokenizer split for SentencePiece-style models) and the cut at ▁.
  std::string s(200000, 'a');
  const auto ids = llama2().encode(s, false);
  EXPECT_EQ(llama2().decode(ids), s);
  std::string words;
  for (int k = 0; k < 20000; ++k) words += "word ";
  EXPECT_EQ(llama2().decode(llama2().encode(words)), words);
}
