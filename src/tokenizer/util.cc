// PCRE2 wrapper, hash tables and the added-token trie.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstring>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace ptllm::tok_detail {

// ------------------------------------------------------------------- Regex
namespace {
// Match data and JIT stack are per thread so one compiled Regex can be used
// concurrently by every thread that encodes with the same Tokenizer.
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  MatchScratch() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~MatchScratch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    if (js) pcre2_jit_stack_free(js);
  }
};
MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& what) {
  int err = 0;
  PCRE2_SIZE off = 0;
  // UCP makes \s, \w, \d and POSIX classes Unicode-aware like Oniguruma's;
  // MATCH_INVALID_UTF lets byte-level tokenizers split inputs that are not
  // valid UTF-8 (invalid bytes simply never match a character class).
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("{}: cannot compile regex /{}/ at offset {}: {}", what, pattern, size_t(off),
         reinterpret_cast<const char*>(msg));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

int link_byte_level(Bpe& bpe) {
  const uint32_t* map = byte_to_cp();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(ch, map[b]);
    bpe.byte_sym[b] = bpe.vocab_map.find(ch);
    if (bpe.byte_sym[b] < 0) return b;
  }
  bpe.raw_vocab.assign(bpe.vocab.size(), std::string());
  bpe.raw_map.build(&bpe.raw_vocab, bpe.vocab.size());
  for (size_t id = 0; id < bpe.vocab.size(); ++id) {
    const std::string& v = bpe.vocab[id];
    std::string raw;
    bool ok = !v.empty();
    for (size_t i = 0; ok && i < v.size();) {
      const int b = byte_from_cp(utf8_next(v, i));
      ok = b >= 0;
      raw.push_back(char(b));
    }
    if (!ok) continue;
    bpe.raw_vocab[id] = std::move(raw);
    bpe.raw_map.insert(int32_t(id));
  }
  bpe.raw_bytes = true;
  return -1;
}

void replace_matches(std::string& s, const Regex* regex, std::string_view from, std::string_view to) {
  std::vector<std::pair<size_t, size_t>> m;
  if (regex) {
    regex->find_all(s, m);
  } else if (!from.empty()) {
    for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + from.size()))
      m.emplace_back(pos, pos + from.size());
  }
  if (m.empty()) return;
  std::string out;
  out.reserve(s.size() + m.size() * to.size());
  size_t last = 0;
  for (auto [mb, me] : m) {
    out.append(s, last, mb - last);
    out.append(to);
    last = me;
  }
  out.append(s, last, std::string::npos);
  s.swap(out);
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  for_each(s, [&](size_t b, size_t e) { out.emplace_back(b, e); });
}

void Regex::for_each_impl(std::string_view s, void (*cb)(void*, size_t, size_t), void* ctx) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& sc = scratch();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t start = 0;
  while (start <= s.size()) {
    int rc = pcre2_match(code, subj, s.size(), start, 0, sc.md, sc.mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(sc.md);
    size_t b = ov[0], e = ov[1];
    if (e == b) {
      // Empty match: never a split of its own (HF drops empty splits); step
      // over one character, as Oniguruma's iterator does.
      if (b >= s.size()) break;
      size_t i = b;
      utf8_next(s, i);
      start = i;
      continue;
    }
    cb(ctx, b, e);
    start = e;
  }
}

// ------------------------------------------------------------------ hashing
uint64_t StrIdMap::hash(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xC2B2AE3D27D4EB4FULL);
  while (n >= 8) {
    uint64_t k;
    std::memcpy(&k, p, 8);
    h = (h ^ (k * 0x87C37B91114253D5ULL)) * 0x4CF5AD432745937FULL;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t k = 0;
  for (size_t i = 0; i < n; ++i) k |= uint64_t(p[i]) << (8 * i);
  h = (h ^ (k * 0x87C37B91114253D5ULL)) * 0x4CF5AD432745937FULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32;
  return h;
}

void StrIdMap::build(const std::vector<std::string>* keys_by_id, size_t n_hint) {
  keys_ = keys_by_id;
  size_t cap = 16;
  while (cap < n_hint * 2) cap <<= 1;
  slots_.assign(cap, 0);
  mask_ = cap - 1;
  size_ = 0;
}

void StrIdMap::grow() {
  std::vector<uint64_t> old = std::move(slots_);
  slots_.assign(old.size() * 2, 0);
  mask_ = slots_.size() - 1;
  size_ = 0;
  for (uint64_t s : old)
    if (s) insert(int32_t(uint32_t(s) - 1));
}

void StrIdMap::insert(int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const std::string& key = (*keys_)[size_t(id)];
  const uint64_t h = hash(key);
  const uint64_t tag = h >> 32;
  const uint64_t packed = (tag << 32) | (uint64_t(uint32_t(id)) + 1);
  size_t i = size_t(h) & mask_;
  while (slots_[i]) {
    if ((slots_[i] >> 32) == tag && (*keys_)[size_t(uint32_t(slots_[i]) - 1)] == key) {
      slots_[i] = packed;
      return;
    }
    i = (i + 1) & mask_;
  }
  slots_[i] = packed;
  ++size_;
}

int32_t StrIdMap::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash(key);
  const uint64_t tag = h >> 32;
  size_t i = size_t(h) & mask_;
  while (true) {
    const uint64_t s = slots_[i];
    if (!s) return -1;
    if ((s >> 32) == tag) {
      const int32_t id = int32_t(uint32_t(s) - 1);
      if ((*keys_)[size_t(id)] == key) return id;
    }
    i = (i + 1) & mask_;
  }
}

void PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
}

void PairMap::insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
  const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  size_t i = mix(key) & mask_;
  while (slots_[i].key != kEmpty) {
    if (slots_[i].key == key) return;  // duplicate merge: the earlier (better) rank stays
    i = (i + 1) & mask_;
  }
  slots_[i] = Slot{key, rank, merged};
}

// --------------------------------------------------------------------- trie
void TokenTrie::add(std::string_view s, int32_t value) {
  if (s.empty()) return;
  first_[static_cast<unsigned char>(s[0])] = true;
  int32_t node = 0;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    int32_t next = -1;
    for (auto& [k, child] : nodes_[size_t(node)].kids)
      if (k == c) next = child;
    if (next < 0) {
      next = int32_t(nodes_.size());
      nodes_[size_t(node)].kids.emplace_back(c, next);
      nodes_.emplace_back();
    }
    node = next;
  }
  // First registration wins, like HF where an existing content keeps its id.
  if (nodes_[size_t(node)].value < 0) nodes_[size_t(node)].value = value;
}

size_t TokenTrie::longest_at(std::string_view s, size_t pos, int32_t* value) const {
  int32_t node = 0;
  size_t best = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    int32_t next = -1;
    for (auto& [k, child] : nodes_[size_t(node)].kids)
      if (k == c) {
        next = child;
        break;
      }
    if (next < 0) break;
    node = next;
    if (nodes_[size_t(node)].value >= 0) {
      best = i + 1 - pos;
      *value = nodes_[size_t(node)].value;
    }
  }
  return best;
}

}  // namespace ptllm::tok_detail
