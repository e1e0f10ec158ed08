// Builds a Tokenizer from GGUF tokenizer.ggml.* metadata with llama.cpp's
// defaults and per-model adjustments (llama-vocab.cpp's load()).
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/impl.h"

namespace ptllm {

namespace {
using tok_detail::LlamaVocab;
using tok_detail::Regex;

constexpr int32_t kUnknown = int32_t(GgufTokenType::Unknown);
constexpr int32_t kControl = int32_t(GgufTokenType::Control);
constexpr int32_t kUser = int32_t(GgufTokenType::UserDefined);

// Pre-tokenizer regexes as llama.cpp applies them. Its hand-written GPT-2 and
// Llama 3 splitters (used whenever those exact patterns appear) include the
// final "\s+" alternative, so the PCRE2 patterns here carry it too.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreSpec {
  std::vector<const char*> names;
  std::vector<const char*> regexes;
  bool ignore_merges = false, add_bos = false;
};

const std::vector<PreSpec>& pre_specs() {
  static const std::vector<PreSpec> specs = {
      {{"default", ""}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}, {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat",
        "a.x-4.0", "mellum", "jina-v1-en", "jina-v2-code", "roberta-bpe"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"}, {kQwen2}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
  };
  return specs;
}

const PreSpec& find_pre(const std::string& pre, const std::string& where) {
  std::string known;
  for (const PreSpec& s : pre_specs())
    for (const char* n : s.names) {
      if (pre == n) return s;
      if (*n) known += known.empty() ? n : std::string(", ") + n;
    }
  fail("{}: unsupported tokenizer.ggml.pre '{}' (supported: {})", where, pre, known);
}

// llama.cpp forces tokens with these texts to be control tokens (end of
// generation / fill-in-the-middle markers that converters left as normal or
// user-defined; "</s>": Phi-3's is user-defined in its GGUF, yet llama.cpp
// does not match it without special parsing).
bool forced_control(std::string_view s) {
  static const std::array<std::string_view, 41> texts = {"</s>", 
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
      "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<|fim_prefix|>", "<fim-prefix>",
      "<fim_prefix>", "<PRE>", "\xE2\x96\x81<PRE>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>",
      "\xE2\x96\x81<SUF>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\xE2\x96\x81<MID>",
      "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
      "<reponame>", "<|file_sep|>", "<|fim_sep|>", "<fim-sep>", "<｜end▁of▁sentence｜>", "<｜fim▁begin｜>"};
  return std::find(texts.begin(), texts.end(), s) != texts.end();
}

void build_gpt2(const GgufVocab& v, const PreSpec& pre, const std::string& where, tok_detail::Impl& t) {
  tok_detail::Bpe& bpe = t.bpe;
  bpe.ignore_merges = pre.ignore_merges;
  bpe.merges.reserve(std::max<size_t>(v.merges.size(), 1));
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.find(' ', 1);  // llama.cpp: the first space after the first character
    if (sp == std::string::npos) fail("{}: tokenizer.ggml.merges[{}] '{}' is not of the form 'a b'", where, r, m);
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    const int32_t ia = bpe.vocab_map.find(a), ib = bpe.vocab_map.find(b), im = bpe.vocab_map.find(a + b);
    if (ia < 0 || ib < 0 || im < 0)
      fail("{}: tokenizer.ggml.merges[{}] '{}' refers to a token missing from tokenizer.ggml.tokens", where, r, m);
    bpe.merges.insert(ia, ib, int32_t(r), im);
  }
  // Words arrive as raw bytes (Bpe::raw_bytes): every byte needs its GPT-2 symbol.
  if (const int b = tok_detail::link_byte_level(bpe); b >= 0)
    fail("{}: gpt2 vocabulary lacks the byte-level symbol for byte 0x{:02X}", where, b);
  auto lv = std::const_pointer_cast<LlamaVocab>(t.llama);
  for (const char* re : pre.regexes) lv->splits.push_back(std::make_shared<Regex>(re, where + ": tokenizer.ggml.pre"));
  t.byte_level = true;
}

}  // namespace

Tokenizer tokenizer_from_gguf_vocab(const GgufVocab& v, const std::string& where) {
  const size_t n = v.tokens.size();
  if (n == 0) fail("{}: tokenizer.ggml.tokens is empty", where);
  if (n >= size_t(INT32_MAX)) fail("{}: tokenizer.ggml.tokens has too many entries ({})", where, n);
  if (!v.scores.empty() && v.scores.size() != n)
    fail("{}: tokenizer.ggml.scores has {} entries, expected one per token ({})", where, v.scores.size(), n);
  if (!v.token_type.empty() && v.token_type.size() != n)
    fail("{}: tokenizer.ggml.token_type has {} entries, expected one per token ({})", where, v.token_type.size(), n);
  if (v.model != "llama" && v.model != "gpt2")
    fail("{}: unsupported tokenizer.ggml.model '{}' (supported: llama, gpt2)", where, v.model);

  auto impl = std::make_shared<tok_detail::Impl>();
  tok_detail::Impl& t = *impl;
  auto lv = std::make_shared<LlamaVocab>();
  t.llama = lv;
  lv->where = where;
  lv->spm = v.model == "llama";

  tok_detail::Bpe& bpe = t.bpe;
  bpe.vocab = v.tokens;
  bpe.vocab_map.build(&bpe.vocab, n);
  for (size_t id = 0; id < n; ++id)
    if (!bpe.vocab[id].empty()) bpe.vocab_map.insert(int32_t(id));  // a later duplicate wins, as in llama.cpp
  for (int b = 0; b < 256; ++b) bpe.byte_ids[b] = bpe.vocab_map.find(fmt::format("<0x{:02X}>", b));
  bpe.uid = tok_detail::next_model_uid();

  lv->scores = v.scores.empty() ? std::vector<float>(n, 0.0f) : v.scores;
  for (size_t id = 0; id < n; ++id)  // NaN would break the merge queue's ordering
    if (std::isnan(lv->scores[id])) fail("{}: tokenizer.ggml.scores[{}] is NaN", where, id);
  lv->type.assign(n, int32_t(GgufTokenType::Normal));
  for (size_t id = 0; id < v.token_type.size(); ++id) {
    const int32_t ty = v.token_type[id];
    lv->type[id] = ty >= 0 && ty <= int32_t(GgufTokenType::Byte) ? ty : int32_t(GgufTokenType::Undefined);
  }
  for (size_t id = 0; id < n; ++id)
    if (forced_control(bpe.vocab[id])) lv->type[id] = kControl;
  for (size_t id = 0; id < n; ++id) {
    const int32_t ty = lv->type[id];
    if ((ty == kControl || ty == kUser || ty == kUnknown) && !bpe.vocab[id].empty()) lv->specials.push_back(int32_t(id));
  }
  std::stable_sort(lv->specials.begin(), lv->specials.end(),
                   [&](int32_t a, int32_t b) { return bpe.vocab[size_t(a)].size() > bpe.vocab[size_t(b)].size(); });
  lv->lstrip.assign(n, 0);
  lv->rstrip.assign(n, 0);
  std::string name = v.name;
  for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    // llama.cpp: Phi-3's special tokens swallow the whitespace after them,
    // except <unk>, <s> and <|endoftext|>.
    for (int32_t id : lv->specials) lv->rstrip[size_t(id)] = 1;
    for (const char* s : {"</s>"})
      if (int32_t id = bpe.vocab_map.find(s); id >= 0) lv->rstrip[size_t(id)] = 1;
    for (const char* s : {"<unk>", "<s>", "<|endoftext|>"})
      if (int32_t id = bpe.vocab_map.find(s); id >= 0) lv->rstrip[size_t(id)] = 0;
  }

  if (lv->spm) {
    static const std::string kSpace = "\xE2\x96\x81";
    lv->spm_cut = true;
    for (const std::string& tok : bpe.vocab) {
      size_t k = 0;
      while (tok.compare(k, kSpace.size(), kSpace) == 0) k += kSpace.size();
      if (tok.find(kSpace, k) != std::string::npos) {
        lv->spm_cut = false;
        break;
      }
    }
  }
  int32_t bos = 1, eos = 2;
  if (lv->spm) {
    lv->add_space_prefix = true;
    lv->add_bos = true;
  } else {
    const PreSpec& pre = find_pre(v.pre, where);
    lv->add_bos = pre.add_bos;
    bos = eos = 11;  // llama.cpp's gpt2 defaults
    build_gpt2(v, pre, where, t);
  }
  auto set_id = [&](const std::optional<int32_t>& id, int32_t& dst) {
    if (id && *id >= 0 && size_t(*id) < n) dst = *id;  // llama.cpp ignores an out-of-range id
  };
  set_id(v.bos, bos);
  set_id(v.eos, eos);
  lv->bos = size_t(bos) < n ? bos : -1;
  lv->eos = size_t(eos) < n ? eos : -1;
  if (v.add_bos) lv->add_bos = *v.add_bos;
  if (v.add_eos) lv->add_eos = *v.add_eos;
  if (v.add_space_prefix) lv->add_space_prefix = *v.add_space_prefix;
  if (lv->add_bos && lv->bos < 0) fail("{}: tokenizer.ggml.add_bos_token is set but there is no BOS token", where);
  if (lv->add_eos && lv->eos < 0) fail("{}: tokenizer.ggml.add_eos_token is set but there is no EOS token", where);

  t.vocab_size = int32_t(n);
  t.added_index.assign(n, -1);
  t.is_special.assign(n, 0);
  for (size_t id = 0; id < n; ++id) t.is_special[id] = lv->type[id] == kControl || lv->type[id] == kUnknown;
  t.added_map.build(&t.added_contents, 0);
  if (lv->bos >= 0) t.bos = lv->bos;
  if (lv->eos >= 0) t.eos = lv->eos;
  return Tokenizer(impl);
}

}  // namespace ptllm
