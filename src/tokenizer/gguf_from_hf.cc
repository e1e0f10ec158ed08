// tokenizer.json -> tokenizer.ggml.* metadata (for `convert` to GGUF), with
// the token types, ids and flags llama.cpp's converter writes, and scores that
// make llama.cpp's score-based SentencePiece merge in the tokenizer.json's
// merge order.
#include <nlohmann/json.hpp>

#include <regex>

#include "core/error.h"
#include "tokenizer/gguf_vocab.h"

namespace ptllm {

namespace {
using nlohmann::json;

const std::string kSpace = "\xE2\x96\x81";

// The split regexes of the tokenizer.json files llama.cpp names (its
// converter recognises them by hashing sample encodings; the pattern is the
// same information).
constexpr const char* kHfLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kHfQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string type_at(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

// Flattens a (possibly Sequence) component into its stages.
std::vector<json> stages(const json& j, const char* list_key) {
  if (j.is_null()) return {};
  if (type_at(j) == "Sequence" && j.contains(list_key)) return j[list_key].get<std::vector<json>>();
  return {j};
}

bool byte_level_regex(const json& bl) { return !bl.contains("use_regex") || bl["use_regex"].get<bool>(); }

std::string detect_pre(const json& pre_tok, const std::string& where) {
  const std::vector<json> st = stages(pre_tok, "pretokenizers");
  if (st.size() == 1 && type_at(st[0]) == "ByteLevel" && byte_level_regex(st[0])) return "gpt-2";
  if (st.size() == 2 && type_at(st[0]) == "Digits" && st[0].value("individual_digits", false) &&
      type_at(st[1]) == "ByteLevel" && byte_level_regex(st[1]))
    return "smollm";
  if (st.size() == 2 && type_at(st[0]) == "Split" && type_at(st[1]) == "ByteLevel" && !byte_level_regex(st[1]) &&
      st[0].contains("pattern") && st[0]["pattern"].contains("Regex")) {
    const std::string re = st[0]["pattern"]["Regex"].get<std::string>();
    if (re == kHfLlama3) return "llama-bpe";
    if (re == kHfQwen2) return "qwen2";
  }
  fail("{}: byte-level pre_tokenizer {} matches none of the llama.cpp pre-tokenizers this converter knows "
       "(gpt-2, llama-bpe, qwen2, smollm)",
       where, pre_tok.dump().substr(0, 200));
}

// SentencePiece-style: spaces become U+2581 (Metaspace pre-tokenizer or a
// Replace normalizer) and byte fallback. Returns whether a prefix space is added.
bool is_spm_style(const json& j, bool* add_prefix) {
  bool space = false, prefix = false;
  for (const json& n : stages(j.value("normalizer", json()), "normalizers")) {
    if (type_at(n) == "Prepend" && n.value("prepend", "") == kSpace) prefix = true;
    if (type_at(n) == "Replace" && n.value("content", "") == kSpace) space = true;
  }
  for (const json& p : stages(j.value("pre_tokenizer", json()), "pretokenizers")) {
    if (type_at(p) != "Metaspace") continue;
    space = true;
    const std::string scheme = p.value("prepend_scheme", std::string("always"));
    prefix = scheme != "never" && p.value("add_prefix_space", true);
  }
  *add_prefix = prefix;
  return space;
}
}  // namespace

namespace {
GgufVocab from_hf(std::string_view tokenizer_json, std::string_view tokenizer_config_json, const std::string& where) {
  // Validates everything and resolves BOS/EOS and the post-processor.
  const Tokenizer tok = Tokenizer::from_json(tokenizer_json, tokenizer_config_json);
  const json j = json::parse(tokenizer_json.begin(), tokenizer_json.end());
  const json cfg = tokenizer_config_json.empty()
                       ? json::object()
                       : json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end());
  const json& m = j.at("model");
  const auto n = size_t(tok.vocab_size());

  GgufVocab v;
  v.tokens.assign(n, std::string());
  std::vector<uint8_t> present(n, 0);
  for (const auto& [piece, id] : m.at("vocab").items()) {
    v.tokens[id.get<size_t>()] = piece;
    present[id.get<size_t>()] = 1;
  }
  v.token_type.assign(n, int32_t(GgufTokenType::Normal));
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"]) {
      const auto id = a.at("id").get<size_t>();
      if (a.at("content").get<std::string>().empty()) continue;
      v.tokens[id] = a["content"].get<std::string>();
      present[id] = 1;
      v.token_type[id] = int32_t(a.value("special", false) ? GgufTokenType::Control : GgufTokenType::UserDefined);
    }
  for (size_t id = 0; id < n; ++id)
    if (!present[id]) {  // llama.cpp's converter fills holes the same way
      v.tokens[id] = "[PAD" + std::to_string(id) + "]";
      v.token_type[id] = int32_t(GgufTokenType::Unused);
    }

  std::vector<std::string> merges;
  for (const json& mg : m.value("merges", json::array()))
    merges.push_back(mg.is_string() ? mg.get<std::string>()
                                    : mg.at(0).get<std::string>() + " " + mg.at(1).get<std::string>());

  bool add_prefix = false;
  const bool byte_fallback = m.value("byte_fallback", false);
  if (byte_fallback && is_spm_style(j, &add_prefix)) {
    v.model = "llama";
    v.pre = "default";
    v.add_space_prefix = add_prefix;
    // llama.cpp merges the pair whose merged token scores highest, so a
    // token's score is minus the rank of the first merge that makes it;
    // tokens no merge makes (characters, bytes, specials) are never compared.
    v.scores.assign(n, 0.0f);
    std::vector<uint8_t> scored(n, 0);
    for (size_t r = 0; r < merges.size(); ++r) {
      const size_t sp = merges[r].find(' ');
      const std::optional<int32_t> id =
          sp == std::string::npos ? std::nullopt
                                  : tok.token_to_id(merges[r].substr(0, sp) + merges[r].substr(sp + 1));
      if (!id || scored[size_t(*id)]) continue;
      scored[size_t(*id)] = 1;
      v.scores[size_t(*id)] = -float(r);
    }
    static const std::regex byte_re("<0x[0-9A-Fa-f]{2}>");
    for (size_t id = 0; id < n; ++id) {
      if (v.token_type[id] == int32_t(GgufTokenType::Normal) && std::regex_match(v.tokens[id], byte_re))
        v.token_type[id] = int32_t(GgufTokenType::Byte);
      if (!scored[id] && v.token_type[id] == int32_t(GgufTokenType::Normal)) v.scores[id] = -float(merges.size() + id);
    }
  } else if (!byte_fallback && type_at(j.value("pre_tokenizer", json())) != "" &&
             j.value("pre_tokenizer", json()).dump().find("\"ByteLevel\"") != std::string::npos) {
    v.model = "gpt2";
    v.pre = detect_pre(j["pre_tokenizer"], where);
    v.merges = std::move(merges);
  } else {
    fail("{}: cannot express this tokenizer as GGUF metadata (supported: SentencePiece-style BPE with byte "
         "fallback -> 'llama', byte-level BPE -> 'gpt2')",
         where);
  }

  v.bos = tok.bos_id();
  v.eos = tok.eos_id();
  if (const std::string unk = m.value("unk_token", json()).is_string() ? m["unk_token"].get<std::string>() : "";
      !unk.empty()) {
    v.unk = tok.token_to_id(unk);
    if (v.unk && v.token_type[size_t(*v.unk)] != int32_t(GgufTokenType::Byte))
      v.token_type[size_t(*v.unk)] = int32_t(GgufTokenType::Unknown);
  }
  if (cfg.is_object() && cfg.contains("pad_token")) {
    const json& p = cfg["pad_token"];
    const std::string name = p.is_string() ? p.get<std::string>() : p.is_object() ? p.value("content", "") : "";
    if (!name.empty()) v.pad = tok.token_to_id(name);
  }
  // What the post-processor (or tokenizer_config's add_bos_token) adds.
  const std::vector<int32_t> empty = tok.encode("", true);
  v.add_bos = v.bos && !empty.empty() && empty.front() == *v.bos;
  v.add_eos = v.eos && empty.size() > (*v.add_bos ? 1u : 0u) && empty.back() == *v.eos;
  return v;
}
}  // namespace

GgufVocab gguf_vocab_from_hf(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                             const std::string& where) {
  try {
    return from_hf(tokenizer_json, tokenizer_config_json, where);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed tokenizer JSON for GGUF conversion ({})", where, e.what());
  }
}

}  // namespace ptllm
