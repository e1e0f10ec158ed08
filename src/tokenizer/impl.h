// Internal data structures of the tokenizer. Not part of the public API; tests
// and benchmarks may include it to poke at components.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ptllm::tok_detail {

// ---------------------------------------------------------------- unicode.cc
// Length of the UTF-8 sequence at p (n bytes available). Returns the number of
// bytes of a well-formed character, or 0 with *bad = maximal ill-formed
// subpart length (Unicode "best practice", what Rust's from_utf8_lossy uses),
// and *truncated = true when the n available bytes are a strict prefix of a
// well-formed character.
size_t utf8_char_len(const unsigned char* p, size_t n, size_t* bad, bool* truncated);
// Decodes one code point; invalid bytes yield cp = 0xFFFFFFFF and advance 1.
uint32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, uint32_t cp);
// False at the first byte that does not start a well-formed character (*first_bad); then
// *truncated says whether the bytes from there to the end are a strict prefix of one (more
// bytes may complete it) rather than ill-formed.
bool utf8_valid(std::string_view s, size_t* first_bad = nullptr, bool* truncated = nullptr);
// Rust String::from_utf8_lossy.
void append_lossy(std::string& out, std::string_view bytes);
// True when `bytes` ends with a strict prefix of a well-formed character, i.e.
// more bytes could still complete it.
bool utf8_ends_incomplete(std::string_view bytes);

bool is_white_space(uint32_t cp);  // Unicode White_Space (Rust char::is_whitespace)
bool is_word_char(uint32_t cp);    // Rust regex \w
bool is_numeric(uint32_t cp);      // Rust char::is_numeric (Nd, Nl, No)

enum class NormForm { NFC, NFD, NFKC, NFKD };
std::string unicode_normalize(std::string_view s, NormForm form);
std::string unicode_lowercase(std::string_view s);

class Regex;
// The HF `Replace` step (normalizer and decoder alike): every non-overlapping
// match of `regex` (or, when it is null, of the literal `from`; an empty one
// matches nothing), left to right, becomes `to`.
void replace_matches(std::string& s, const Regex* regex, std::string_view from, std::string_view to);

// GPT-2 byte <-> printable code point mapping.
const uint32_t* byte_to_cp();  // 256 entries
int byte_from_cp(uint32_t cp);  // -1 if not part of the alphabet

// ------------------------------------------------------------------ regex.cc
// PCRE2 (UTF + UCP + JIT) wrapper. Immutable and safe to share across threads
// (per-thread match data).
class Regex {
 public:
  explicit Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Appends (start, end) of all non-empty, non-overlapping matches.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  // Calls f(start, end) for each such match, without materialising a list.
  template <typename F>
  void for_each(std::string_view s, F&& f) const {
    using Fn = std::remove_reference_t<F>;
    for_each_impl(
        s, [](void* ctx, size_t b, size_t e) { (*static_cast<Fn*>(ctx))(b, e); },
        const_cast<void*>(static_cast<const void*>(&f)));
  }

 private:
  void for_each_impl(std::string_view s, void (*cb)(void*, size_t, size_t), void* ctx) const;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// ------------------------------------------------------------------- hashing
// Open-addressing string -> id table. Keys live in an external string array
// (the vocabulary), so the table itself is just ints.
class StrIdMap {
 public:
  void build(const std::vector<std::string>* keys_by_id, size_t n_hint);
  void insert(int32_t id);  // key = (*keys_)[id]; later inserts of an equal key win
  int32_t find(std::string_view key) const;  // -1 if absent
  static uint64_t hash(std::string_view s);

 private:
  void grow();
  const std::vector<std::string>* keys_ = nullptr;
  // (hash tag << 32) | (id + 1); 0 = empty. Tag and id share one 8-byte slot
  // so a probe touches a single cache line before the key comparison.
  std::vector<uint64_t> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id).
class PairMap {
 public:
  void reserve(size_t n);
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged);  // first insert wins
  bool find(int32_t a, int32_t b, int32_t* rank, int32_t* merged) const {
    uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t i = mix(key) & mask_;
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *rank = s.rank;
        *merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return size_t(k);
  }
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// ---------------------------------------------------------------- components
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

// Leftmost-longest literal matcher over the added tokens (what HF's
// aho-corasick with MatchKind::LeftmostLongest produces).
class TokenTrie {
 public:
  void add(std::string_view s, int32_t value);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest pattern starting exactly at s[pos]; returns its length (0 = none).
  size_t longest_at(std::string_view s, size_t pos, int32_t* value) const;
  bool may_start(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t value = -1;
  };
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
};

struct Normalizer {
  enum class Kind { Sequence, Prepend, Replace, Unicode, Lowercase, Strip } kind;
  std::vector<Normalizer> children;  // Sequence
  std::string a, b;                  // Prepend: a; Replace: a (literal) -> b
  std::shared_ptr<Regex> regex;      // Replace with a Regex pattern
  NormForm form = NormForm::NFC;
  bool left = false, right = false;  // Strip
  void apply(std::string& s) const;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// One split of the text on its way through the pre-tokenizers. `at_origin`
// tracks HF's "original offset == 0" (Metaspace prepend_scheme "first").
struct Piece {
  std::string text;
  bool at_origin = false;
};

// Type-erased reference to a callable taking a Piece (the pre-tokenizer
// pipeline streams pieces through nested stages without building lists).
class PieceSink {
 public:
  template <typename F>
  PieceSink(F& f) : obj_(&f), fn_([](void* o, Piece& p) { (*static_cast<F*>(o))(p); }) {}
  void operator()(Piece& p) const { fn_(obj_, p); }

 private:
  void* obj_;
  void (*fn_)(void*, Piece&);
};

struct PreTokenizer {
  enum class Kind { Sequence, Split, ByteLevel, Digits, Metaspace, WhitespaceSplit, Whitespace } kind;
  std::vector<PreTokenizer> children;
  std::shared_ptr<Regex> regex;  // Split (regex or escaped literal), ByteLevel(use_regex), Whitespace
  std::string literal;           // Split with a String pattern
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  // ByteLevel as the final stage: leave pieces as raw bytes, the model then
  // works on bytes directly (Bpe::raw_bytes) instead of mapped characters.
  bool defer_mapping = false;
  bool individual_digits = false;
  std::string replacement;        // Metaspace
  int prepend_scheme = 0;         // Metaspace: 0 always, 1 first, 2 never
  bool split = true;              // Metaspace
  // Feeds the pieces `p` splits into to `sink` (Sequence: through every stage).
  void run(Piece& p, PieceSink sink) const;
  void apply(std::vector<Piece>& pieces) const;  // list form, for tests

 private:
  void run_from(size_t stage, Piece& p, PieceSink sink) const;
};

struct Bpe {
  std::vector<std::string> vocab;  // id -> piece ("" for holes)
  StrIdMap vocab_map;
  PairMap merges;
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;
  int32_t byte_ids[256];          // "<0xHH>" ids for byte fallback (-1 if absent)
  // Fast initial-symbol lookup for single code points < 0x10000 when there is
  // no prefix/suffix decoration: -2 = not computed/not applicable.
  std::vector<int32_t> cp_ids;
  // When every vocabulary token holding `split_marker` ("▁") has it only as a
  // leading run, no token can span "x▁" for a non-marker x, so a word can be
  // cut before such a marker and the parts merged independently with an
  // identical result. This keeps SentencePiece-style models (no
  // pre-tokenizer: the whole text is one "word") linear-time and cacheable.
  std::string split_marker;
  // Byte-level models whose pre-tokenizer ends with ByteLevel: words arrive
  // as raw bytes; initial symbols come from byte_sym and whole-word lookups
  // (ignore_merges) from raw_map over the byte-decoded vocabulary. Same ids,
  // without re-encoding every byte as a 1-2 byte UTF-8 character.
  bool raw_bytes = false;
  int32_t byte_sym[256];
  std::vector<std::string> raw_vocab;
  StrIdMap raw_map;
  uint64_t uid = 0;  // identifies this model in the per-thread word cache
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  void tokenize_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void tokenize_cached(std::string_view word, std::vector<int32_t>& out) const;
};

// Byte-level BPE (GPT-2 alphabet): points bpe.byte_sym at each byte's symbol
// and fills raw_vocab / raw_map with every token's bytes, so encoding can skip
// the byte -> code point mapping (raw_bytes). Returns -1, or the first byte
// whose symbol the vocabulary lacks (then nothing is switched on).
int link_byte_level(Bpe& bpe);

struct PostProcessor {
  enum class Kind { None, Template, ByteLevel, Sequence, Bert } kind = Kind::None;
  std::vector<PostProcessor> children;
  // Template / Bert/Roberta: ids before and after sequence A.
  std::vector<int32_t> prefix, suffix;
  void apply(std::vector<int32_t>& ids) const;
};

struct Decoder {
  enum class Kind { Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace } kind;
  std::vector<Decoder> children;
  std::string a, b;  // Replace a -> b; Metaspace replacement in a
  std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
  char32_t strip_content = U' ';
  size_t start = 0, stop = 0;
  int prepend_scheme = 0;
  void apply(std::vector<std::string>& tokens) const;
  bool has(Kind k) const;
};

// Tokenizers from GGUF metadata (gguf_vocab.h), encoded and decoded with
// llama.cpp's rules instead of the HF pipeline. The vocabulary itself lives in
// Impl::bpe (vocab, vocab_map; merges and raw-byte tables for "gpt2").
struct LlamaVocab {
  bool spm = true;                      // model "llama"; false = "gpt2"
  std::vector<float> scores;            // by id (SPM merge priority)
  std::vector<int32_t> type;            // by id, GgufTokenType values
  std::vector<int32_t> specials;        // control/user-defined/unknown ids, longest text first
  std::vector<uint8_t> lstrip, rstrip;  // by id: eat whitespace around a matched special
  bool add_space_prefix = false, add_bos = false, add_eos = false;
  // SPM: every token holding U+2581 has it only as a leading run, so no merge
  // can join "x" and a following U+2581 (x not U+2581): valid UTF-8 text is cut
  // there and each part merged alone, with identical ids (as Bpe::split_marker).
  bool spm_cut = false;
  int32_t bos = -1, eos = -1;
  std::string where;                    // source, for errors
  std::vector<std::shared_ptr<Regex>> splits;  // gpt2: pre-tokenizer regexes, applied in order
  std::vector<int32_t> encode(const Impl& t, std::string_view text, bool add_special, bool parse_special) const;
  std::string decode(const Impl& t, std::span<const int32_t> ids, bool skip_special) const;
  void spm_tokenize(const Impl& t, std::string_view text, std::vector<int32_t>& out) const;
};

struct Impl {
  Bpe bpe;
  std::shared_ptr<const LlamaVocab> llama;  // set for GGUF vocabularies
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  PostProcessor post;
  std::optional<Decoder> decoder;

  std::vector<AddedToken> added;         // in tokenizer.json order
  std::vector<int32_t> added_index;      // id -> index into `added`, -1 otherwise
  TokenTrie trie_raw, trie_normalized;   // values = index into `added`
  std::vector<std::string> added_contents;    // by index into `added`
  StrIdMap added_map;                          // content -> index into `added`
  std::vector<uint8_t> is_special;            // by id

  int32_t vocab_size = 0;
  std::optional<int32_t> bos, eos;
  bool byte_level = false;  // input bytes are always representable
  bool stream_unsafe_tail = false;  // decoder mutates the end of the text (Strip stop>0)

  // Piece used when decoding id (added-token content or vocab string).
  const std::string* piece(int32_t id) const;
  // parse_special = false: special added tokens written in the text are
  // encoded as plain text (HF's encode_special_tokens; llama.cpp's
  // parse_special = false).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  bool skipped(int32_t id, bool skip_special) const {
    return skip_special && id >= 0 && size_t(id) < is_special.size() && is_special[size_t(id)];
  }
  bool is_byte_piece(int32_t id) const;  // "<0xHH>" handled by ByteFallback
};

// Distinct per loaded model (keys the per-thread BPE word cache).
uint64_t next_model_uid();

std::shared_ptr<Impl> load_impl(std::string_view json_text, std::string_view config_text,
                                const std::string& where);

}  // namespace ptllm::tok_detail
