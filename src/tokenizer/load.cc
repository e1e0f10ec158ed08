// tokenizer.json / tokenizer_config.json loading. Every component type is
// checked here so that unsupported tokenizers fail at load time with a message
// naming the component and the supported alternatives.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "tokenizer/impl.h"
#include "tokenizer/load_sax.h"

namespace ptllm::tok_detail {

using nlohmann::json;

namespace {

constexpr const char* kModels = "BPE";
constexpr const char* kNormalizers = "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip";
constexpr const char* kPreTokenizers = "Sequence, Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit";
constexpr const char* kDecoders = "Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace";
constexpr const char* kPostProcessors = "TemplateProcessing, ByteLevel, Sequence, BertProcessing, RobertaProcessing";

struct Ctx {
  const std::string& where;
  // Ids size tables (vocab, added_index, is_special: one entry per id up to
  // the largest), so a large id must be backed by a file of that size: ids
  // below max(file bytes, 65536) are accepted, which every real tokenizer
  // meets (each id needs its own entry in the file).
  int64_t id_limit;
  // Sequence nesting depth: components are parsed and applied recursively,
  // so a crafted file nested 50,000 deep overflowed the stack.
  mutable int depth = 0;
};

// A token id from the file: an integer in [0, id_limit). json::get<int32_t>()
// on a float such as 1e108 is an out-of-range conversion (UB, found by
// fuzz_tokenizer_json), so the type and range are checked first.
int32_t get_id(const json& v, const Ctx& c, const char* what) {
  if (!v.is_number_integer()) fail("{}: {} must be an integer token id", c.where, what);
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id >= c.id_limit)
    fail("{}: {} {} is out of range (expected 0..{} for a tokenizer.json of this size)", c.where, what, id, c.id_limit - 1);
  return int32_t(id);
}

constexpr int kMaxNesting = 64;
struct Nest {
  const Ctx& c;
  Nest(const Ctx& ctx, const char* component) : c(ctx) {
    if (++c.depth > kMaxNesting)
      fail("{}: {} Sequence nested deeper than {} levels", c.where, component, kMaxNesting);
  }
  ~Nest() { --c.depth; }
};

std::string type_of(const json& j, const Ctx& c, const char* component) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: {} must be an object with a string \"type\"", c.where, component);
  return j["type"].get<std::string>();
}

bool get_bool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<bool>();
}

// A small non-negative count (e.g. Strip's start/stop). json::value<size_t>()
// converts a float like 1e80 out of range (undefined behaviour): refuse it.
size_t get_count(const json& j, const char* key, const Ctx& c, const char* component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (int64_t(1) << 20))
    fail("{}: {} \"{}\" must be an integer in [0, 1048576]", c.where, component, key);
  return size_t(it->get<int64_t>());
}

std::string get_str(const json& j, const char* key, const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<std::string>();
}

// HF Pattern: {"String": "..."} or {"Regex": "..."}.
void parse_pattern(const json& j, const Ctx& c, const char* component, std::string* literal,
                   std::shared_ptr<Regex>* regex) {
  if (j.is_object() && j.contains("String")) {
    *literal = j["String"].get<std::string>();
  } else if (j.is_object() && j.contains("Regex")) {
    *regex = std::make_shared<Regex>(j["Regex"].get<std::string>(), c.where + ": " + component);
  } else {
    fail("{}: {} pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}", c.where, component);
  }
}

int parse_prepend_scheme(const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    const std::string s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return 0;
    if (s == "first") return 1;
    if (s == "never") return 2;
  }
  return get_bool(j, "add_prefix_space", true) ? 0 : 2;  // legacy field
}

Normalizer parse_normalizer(const json& j, const Ctx& c) {
  const std::string t = type_of(j, c, "normalizer");
  Normalizer n{};
  if (t == "Sequence") {
    n.kind = Normalizer::Kind::Sequence;
    const Nest nest(c, "normalizer");
    for (const json& k : j.at("normalizers")) n.children.push_back(parse_normalizer(k, c));
  } else if (t == "Prepend") {
    n.kind = Normalizer::Kind::Prepend;
    n.a = j.at("prepend").get<std::string>();
  } else if (t == "Replace") {
    n.kind = Normalizer::Kind::Replace;
    parse_pattern(j.at("pattern"), c, "Replace normalizer", &n.a, &n.regex);
    n.b = j.at("content").get<std::string>();
  } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    n.kind = Normalizer::Kind::Unicode;
    n.form = t == "NFC" ? NormForm::NFC : t == "NFD" ? NormForm::NFD : t == "NFKC" ? NormForm::NFKC : NormForm::NFKD;
  } else if (t == "Lowercase") {
    n.kind = Normalizer::Kind::Lowercase;
  } else if (t == "Strip") {
    n.kind = Normalizer::Kind::Strip;
    n.left = get_bool(j, "strip_left", true);
    n.right = get_bool(j, "strip_right", true);
  } else {
    fail("{}: unsupported normalizer '{}' (supported: {})", c.where, t, kNormalizers);
  }
  return n;
}

SplitBehavior parse_behavior(const json& j, const Ctx& c) {
  const std::string b = j.get<std::string>();
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unsupported Split behavior '{}' (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, "
       "Contiguous)",
       c.where, b);
}

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

PreTokenizer parse_pre_tokenizer(const json& j, const Ctx& c, bool* byte_level) {
  const std::string t = type_of(j, c, "pre_tokenizer");
  PreTokenizer p{};
  if (t == "Sequence") {
    p.kind = PreTokenizer::Kind::Sequence;
    const Nest nest(c, "pre_tokenizer");
    for (const json& k : j.at("pretokenizers")) p.children.push_back(parse_pre_tokenizer(k, c, byte_level));
  } else if (t == "Split") {
    p.kind = PreTokenizer::Kind::Split;
    parse_pattern(j.at("pattern"), c, "Split pre_tokenizer", &p.literal, &p.regex);
    p.behavior = parse_behavior(j.at("behavior"), c);
    p.invert = get_bool(j, "invert", false);
  } else if (t == "ByteLevel") {
    p.kind = PreTokenizer::Kind::ByteLevel;
    p.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) p.regex = std::make_shared<Regex>(kGpt2Regex, c.where + ": ByteLevel");
    *byte_level = true;
  } else if (t == "Digits") {
    p.kind = PreTokenizer::Kind::Digits;
    p.individual_digits = get_bool(j, "individual_digits", false);
  } else if (t == "Metaspace") {
    p.kind = PreTokenizer::Kind::Metaspace;
    p.replacement = get_str(j, "replacement", "\xE2\x96\x81");
    p.prepend_scheme = parse_prepend_scheme(j);
    p.split = get_bool(j, "split", true);
  } else if (t == "WhitespaceSplit") {
    p.kind = PreTokenizer::Kind::WhitespaceSplit;
  } else if (t == "Whitespace") {
    p.kind = PreTokenizer::Kind::Whitespace;
    p.regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", c.where + ": Whitespace");
  } else {
    fail("{}: unsupported pre_tokenizer '{}' (supported: {})", c.where, t, kPreTokenizers);
  }
  return p;
}

Decoder parse_decoder(const json& j, const Ctx& c) {
  const std::string t = type_of(j, c, "decoder");
  Decoder d{};
  if (t == "Sequence") {
    d.kind = Decoder::Kind::Sequence;
    const Nest nest(c, "decoder");
    for (const json& k : j.at("decoders")) d.children.push_back(parse_decoder(k, c));
  } else if (t == "Replace") {
    d.kind = Decoder::Kind::Replace;
    parse_pattern(j.at("pattern"), c, "Replace decoder", &d.a, &d.regex);
    d.b = j.at("content").get<std::string>();
  } else if (t == "ByteFallback") {
    d.kind = Decoder::Kind::ByteFallback;
  } else if (t == "Fuse") {
    d.kind = Decoder::Kind::Fuse;
  } else if (t == "Strip") {
    d.kind = Decoder::Kind::Strip;
    const std::string content = get_str(j, "content", " ");
    size_t i = 0;
    const uint32_t cp = content.empty() ? ' ' : utf8_next(content, i);
    if (content.empty() || i != content.size() || cp == 0xFFFFFFFFu)
      fail("{}: Strip decoder content must be a single character", c.where);
    d.strip_content = char32_t(cp);
    d.start = get_count(j, "start", c, "Strip decoder");
    d.stop = get_count(j, "stop", c, "Strip decoder");
  } else if (t == "ByteLevel") {
    d.kind = Decoder::Kind::ByteLevel;
  } else if (t == "Metaspace") {
    d.kind = Decoder::Kind::Metaspace;
    d.a = get_str(j, "replacement", "\xE2\x96\x81");
    d.prepend_scheme = parse_prepend_scheme(j);
  } else {
    fail("{}: unsupported decoder '{}' (supported: {})", c.where, t, kDecoders);
  }
  return d;
}

PostProcessor parse_post(const json& j, const Ctx& c) {
  const std::string t = type_of(j, c, "post_processor");
  PostProcessor p{};
  if (t == "TemplateProcessing") {
    p.kind = PostProcessor::Kind::Template;
    const json& specials = j.at("special_tokens");
    bool seen_a = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        const std::string id = item["Sequence"].at("id").get<std::string>();
        if (id != "A" || seen_a) fail("{}: TemplateProcessing 'single' must contain $A exactly once", c.where);
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        if (!specials.contains(name))
          fail("{}: TemplateProcessing uses special token '{}' missing from special_tokens", c.where, name);
        auto& dst = seen_a ? p.suffix : p.prefix;
        for (const json& id : specials[name].at("ids")) dst.push_back(get_id(id, c, "TemplateProcessing special token id"));
      } else {
        fail("{}: TemplateProcessing item must be Sequence or SpecialToken", c.where);
      }
    }
    if (!seen_a) fail("{}: TemplateProcessing 'single' has no $A", c.where);
  } else if (t == "ByteLevel") {
    p.kind = PostProcessor::Kind::ByteLevel;
  } else if (t == "Sequence") {
    p.kind = PostProcessor::Kind::Sequence;
    const Nest nest(c, "post_processor");
    for (const json& k : j.at("processors")) p.children.push_back(parse_post(k, c));
  } else if (t == "BertProcessing" || t == "RobertaProcessing") {
    p.kind = PostProcessor::Kind::Bert;
    p.prefix.push_back(get_id(j.at("cls").at(1), c, "post_processor cls id"));
    p.suffix.push_back(get_id(j.at("sep").at(1), c, "post_processor sep id"));
  } else {
    fail("{}: unsupported post_processor '{}' (supported: {})", c.where, t, kPostProcessors);
  }
  return p;
}

void parse_bpe(const json& m, RawModel& raw, const Ctx& c, Bpe& bpe) {
  if (!raw.bad.empty()) fail("{}: {}", c.where, raw.bad);
  if (!raw.has_vocab) fail("{}: model has no \"vocab\"", c.where);
  if (!raw.has_merges) fail("{}: BPE model has no \"merges\"", c.where);
  size_t max_id = 0;
  for (const auto& [piece, id] : raw.vocab) {
    if (id < 0 || id >= c.id_limit)
      fail("{}: model.vocab id {} for '{}' is out of range (expected 0..{} for a tokenizer.json of this size)", c.where,
           id, piece, c.id_limit - 1);
    max_id = std::max(max_id, size_t(id));
  }
  bpe.vocab.assign(raw.vocab.empty() ? 0 : max_id + 1, std::string());
  for (auto& [piece, id] : raw.vocab) bpe.vocab[size_t(id)] = std::move(piece);
  raw.vocab.clear();
  bpe.vocab_map.build(&bpe.vocab, bpe.vocab.size());
  for (size_t id = 0; id < bpe.vocab.size(); ++id)
    if (!bpe.vocab[id].empty()) bpe.vocab_map.insert(int32_t(id));

  bpe.fuse_unk = get_bool(m, "fuse_unk", false);
  bpe.byte_fallback = get_bool(m, "byte_fallback", false);
  bpe.ignore_merges = get_bool(m, "ignore_merges", false);
  bpe.continuing_subword_prefix = get_str(m, "continuing_subword_prefix", "");
  bpe.end_of_word_suffix = get_str(m, "end_of_word_suffix", "");
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() > 0.0)
    fail("{}: BPE dropout is not supported (inference needs deterministic encoding)", c.where);
  const std::string unk = get_str(m, "unk_token", "");
  if (!unk.empty()) {
    bpe.unk_id = bpe.vocab_map.find(unk);
    if (bpe.unk_id < 0) fail("{}: model.unk_token '{}' is not in the vocabulary", c.where, unk);
  }
  for (int b = 0; b < 256; ++b) bpe.byte_ids[b] = bpe.vocab_map.find(fmt::format("<0x{:02X}>", b));

  bpe.merges.reserve(raw.merges.size());
  const std::string& pfx = bpe.continuing_subword_prefix;
  std::string merged;
  int32_t rank = 0;
  for (const auto& [a, b] : raw.merges) {
    const int32_t ia = bpe.vocab_map.find(a), ib = bpe.vocab_map.find(b);
    merged = a;
    merged.append(b, (!pfx.empty() && b.compare(0, pfx.size(), pfx) == 0) ? pfx.size() : 0, std::string::npos);
    const int32_t im = bpe.vocab_map.find(merged);
    if (ia < 0 || ib < 0 || im < 0)
      fail("{}: merge #{} '{} {}' refers to a token missing from the vocabulary", c.where, rank, a, b);
    bpe.merges.insert(ia, ib, rank, im);
    ++rank;
  }
  if (raw.merges.empty()) bpe.merges.reserve(1);

  // Direct table for single-code-point symbols (the common initial symbols).
  if (bpe.continuing_subword_prefix.empty() && bpe.end_of_word_suffix.empty()) {
    bpe.cp_ids.assign(0x10000, -1);
    for (size_t id = 0; id < bpe.vocab.size(); ++id) {
      const std::string& s = bpe.vocab[id];
      if (s.empty() || s.size() > 3) continue;
      size_t i = 0;
      const uint32_t cp = utf8_next(s, i);
      if (i == s.size() && cp < 0x10000 && bpe.vocab_map.find(s) == int32_t(id)) bpe.cp_ids[cp] = int32_t(id);
    }
  }

  // SentencePiece word boundary: see Bpe::split_marker.
  static const std::string kMarker = "\xE2\x96\x81";
  if (pfx.empty() && bpe.end_of_word_suffix.empty() && bpe.vocab_map.find(kMarker) >= 0) {
    bool ok = true;
    for (const std::string& v : bpe.vocab) {
      size_t k = 0;
      while (v.compare(k, kMarker.size(), kMarker) == 0) k += kMarker.size();
      if (v.find(kMarker, k) != std::string::npos) {
        ok = false;
        break;
      }
    }
    if (ok) bpe.split_marker = kMarker;
  }
  bpe.uid = next_model_uid();
}

// See Bpe::raw_bytes. Only when ByteLevel is the very last stage (nothing
// after it could observe the difference) and every byte has its own symbol.
void enable_raw_bytes(PreTokenizer& pt, Bpe& bpe) {
  PreTokenizer* last = &pt;
  while (last->kind == PreTokenizer::Kind::Sequence && !last->children.empty()) last = &last->children.back();
  if (last->kind != PreTokenizer::Kind::ByteLevel) return;
  if (!bpe.continuing_subword_prefix.empty() || !bpe.end_of_word_suffix.empty()) return;
  if (link_byte_level(bpe) >= 0) return;
  last->defer_mapping = true;
}

bool decoder_has(const Decoder& d, Decoder::Kind k, size_t* strip_stop) {
  if (d.kind == Decoder::Kind::Strip && d.stop > 0) *strip_stop = d.stop;
  if (d.kind == k) return true;
  bool any = false;
  for (const auto& ch : d.children) any = decoder_has(ch, k, strip_stop) || any;
  return any;
}

// bos_token / eos_token in tokenizer_config.json: a string, an AddedToken-like
// object with "content", or null.
std::optional<std::string> config_token(const json& cfg, const char* key, bool* present) {
  auto it = cfg.find(key);
  *present = it != cfg.end();
  if (!*present || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

uint64_t next_model_uid() {
  static std::atomic<uint64_t> next_uid{1};
  return next_uid.fetch_add(1);
}

std::shared_ptr<Impl> load_impl(std::string_view json_text, std::string_view config_text, const std::string& where) {
  Ctx c{where, std::max<int64_t>(int64_t(json_text.size()), int64_t(1) << 16)};
  json j;
  RawModel raw;
  try {
    CaptureSax sax(j, raw);
    json::sax_parse(json_text.begin(), json_text.end(), &sax);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", where, e.what());
  }
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  try {
    if (!j.is_object() || !j.contains("model")) fail("{}: expected a tokenizer.json object with a \"model\"", where);
    const json& m = j["model"];
    std::string mtype = m.contains("type") ? m["type"].get<std::string>() : (raw.has_merges ? "BPE" : "?");
    if (mtype != "BPE") fail("{}: unsupported model type '{}' (supported: {})", where, mtype, kModels);
    parse_bpe(m, raw, c, t.bpe);

    if (j.contains("normalizer") && !j["normalizer"].is_null()) t.normalizer = parse_normalizer(j["normalizer"], c);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
      t.pre_tokenizer = parse_pre_tokenizer(j["pre_tokenizer"], c, &t.byte_level);
      enable_raw_bytes(*t.pre_tokenizer, t.bpe);
    }
    if (j.contains("post_processor") && !j["post_processor"].is_null()) t.post = parse_post(j["post_processor"], c);
    if (j.contains("decoder") && !j["decoder"].is_null()) {
      t.decoder = parse_decoder(j["decoder"], c);
      size_t stop = 0;
      decoder_has(*t.decoder, Decoder::Kind::Fuse, &stop);
      // Strip(start > 1) can remove leading characters of several tokens, which
      // the one-token context of StreamDecoder cannot reproduce (found by
      // fuzz_tokenizer_json): such decoders are streamed like Strip(stop > 0).
      auto strip_start = [](const Decoder& d, auto& self) -> size_t {
        size_t m = d.kind == Decoder::Kind::Strip ? d.start : 0;
        for (const auto& ch : d.children) m = std::max(m, self(ch, self));
        return m;
      };
      t.stream_unsafe_tail = stop > 0 || strip_start(*t.decoder, strip_start) > 1;
    }

    int32_t max_id = int32_t(t.bpe.vocab.size()) - 1;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const json& a : j["added_tokens"]) {
        AddedToken tok;
        if (!a.at("id").is_number_integer()) fail("{}: added token id must be an integer", where);
        const int64_t raw_id = a.at("id").get<int64_t>();
        tok.id = int32_t(std::clamp<int64_t>(raw_id, -1, c.id_limit));  // range-checked below
        tok.content = a.at("content").get<std::string>();
        tok.special = get_bool(a, "special", false);
        tok.normalized = get_bool(a, "normalized", !tok.special);
        tok.lstrip = get_bool(a, "lstrip", false);
        tok.rstrip = get_bool(a, "rstrip", false);
        tok.single_word = get_bool(a, "single_word", false);
        if (tok.id < 0) fail("{}: added token '{}' has negative id", where, tok.content);
        if (tok.id >= c.id_limit)
          fail("{}: added token '{}' id {} is out of range (expected 0..{} for a tokenizer.json of this size)", where,
               tok.content, raw_id, c.id_limit - 1);
        if (tok.content.empty()) continue;  // HF ignores empty added tokens
        max_id = std::max(max_id, tok.id);
        t.added.push_back(std::move(tok));
      }
    }
    t.vocab_size = max_id + 1;
    t.added_index.assign(size_t(t.vocab_size), -1);
    t.is_special.assign(size_t(t.vocab_size), 0);
    t.added_contents.reserve(t.added.size());
    for (const AddedToken& tok : t.added) t.added_contents.push_back(tok.content);
    t.added_map.build(&t.added_contents, t.added.size());
    for (size_t k = 0; k < t.added.size(); ++k) {
      const AddedToken& tok = t.added[k];
      if (t.added_index[size_t(tok.id)] < 0) t.added_index[size_t(tok.id)] = int32_t(k);
      if (t.added_map.find(tok.content) < 0) t.added_map.insert(int32_t(k));
      if (tok.normalized) {
        std::string n = tok.content;
        if (t.normalizer) t.normalizer->apply(n);
        t.trie_normalized.add(n, int32_t(k));
      } else {
        t.trie_raw.add(tok.content, int32_t(k));
      }
    }
    // HF's is_special_token compares contents, so vocab entries spelled like
    // a special token are skipped too.
    for (const AddedToken& tok : t.added) {
      if (!tok.special) continue;
      t.is_special[size_t(tok.id)] = 1;
      const int32_t vid = t.bpe.vocab_map.find(tok.content);
      if (vid >= 0) t.is_special[size_t(vid)] = 1;
    }

    auto lookup = [&](const std::string& s) -> std::optional<int32_t> {
      const int32_t k = t.added_map.find(s);
      if (k >= 0) return t.added[size_t(k)].id;
      const int32_t v = t.bpe.vocab_map.find(s);
      if (v >= 0) return v;
      return std::nullopt;
    };

    json cfg = json::object();
    if (!config_text.empty()) {
      try {
        cfg = json::parse(config_text.begin(), config_text.end());
      } catch (const json::exception& e) {
        fail("{}: tokenizer_config.json is not valid JSON ({})", where, e.what());
      }
      if (!cfg.is_object()) fail("{}: tokenizer_config.json must be a JSON object", where);
    }
    bool bos_present = false, eos_present = false;
    const auto bos_name = config_token(cfg, "bos_token", &bos_present);
    const auto eos_name = config_token(cfg, "eos_token", &eos_present);
    if (bos_name) t.bos = lookup(*bos_name);
    if (eos_name) t.eos = lookup(*eos_name);
    if (!bos_present) {
      // No config: the first special token the post-processor prepends is the
      // BOS; otherwise try the usual spellings.
      const PostProcessor* pp = &t.post;
      while (pp->kind == PostProcessor::Kind::Sequence && !pp->children.empty()) {
        auto it = std::find_if(pp->children.begin(), pp->children.end(),
                               [](const PostProcessor& x) { return !x.prefix.empty(); });
        pp = it == pp->children.end() ? &pp->children.back() : &*it;
      }
      if (!pp->prefix.empty()) t.bos = pp->prefix.front();
      for (const char* name : {"<s>", "<|begin_of_text|>", "<bos>"})
        if (!t.bos) t.bos = lookup(name);
    }
    if (!eos_present)
      for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"})
        if (!t.eos) t.eos = lookup(name);

    // transformers' Llama-style tokenizers rebuild the post-processor from
    // add_bos_token / add_eos_token; do the same when the config says so.
    const bool has_add_bos = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean();
    const bool has_add_eos = cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean();
    if (has_add_bos || has_add_eos) {
      PostProcessor p{};
      p.kind = PostProcessor::Kind::Template;
      if (has_add_bos && cfg["add_bos_token"].get<bool>()) {
        if (!t.bos) fail("{}: tokenizer_config.json sets add_bos_token but bos_token is not in the vocabulary", where);
        p.prefix.push_back(*t.bos);
      }
      if (has_add_eos && cfg["add_eos_token"].get<bool>()) {
        if (!t.eos) fail("{}: tokenizer_config.json sets add_eos_token but eos_token is not in the vocabulary", where);
        p.suffix.push_back(*t.eos);
      }
      t.post = std::move(p);
    }
    auto check_ids = [&](const PostProcessor& p, auto& self) -> void {
      for (int32_t id : p.prefix)
        if (id < 0 || id >= t.vocab_size) fail("{}: post_processor token id {} is outside the vocabulary", where, id);
      for (int32_t id : p.suffix)
        if (id < 0 || id >= t.vocab_size) fail("{}: post_processor token id {} is outside the vocabulary", where, id);
      for (const auto& ch : p.children) self(ch, self);
    };
    check_ids(t.post, check_ids);
  } catch (const json::exception& e) {
    fail("{}: malformed tokenizer JSON ({})", where, e.what());
  } catch (const Error& e) {
    // Messages echo strings from the file (component types, pieces), which may
    // hold newlines: escape them so the error stays one line (fuzz_tokenizer_json).
    std::string m;
    for (char ch : std::string_view(e.what())) m += ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : std::string(1, ch);
    throw Error(m);
  }
  return impl;
}

}  // namespace ptllm::tok_detail
