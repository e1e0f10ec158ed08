// GGUF (tokenizer.ggml.*) vocabularies with llama.cpp's encoding rules: the
// special-token partition, SentencePiece score merging ("llama") and
// byte-level BPE after the tokenizer.ggml.pre regexes ("gpt2"), and decoding.
#include <algorithm>
#include <cctype>
#include <queue>

#include "core/error.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/impl.h"

namespace ptllm {
namespace tok_detail {

namespace {

constexpr int32_t kUnknown = int32_t(GgufTokenType::Unknown);
constexpr int32_t kControl = int32_t(GgufTokenType::Control);
constexpr int32_t kUser = int32_t(GgufTokenType::UserDefined);
constexpr int32_t kNormal = int32_t(GgufTokenType::Normal);
constexpr int32_t kByte = int32_t(GgufTokenType::Byte);

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// C isspace in the "C" locale, which llama.cpp uses for lstrip/rstrip.
bool c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// llama.cpp's unicode_len_utf8: the sequence length claimed by a lead byte
// (continuation bytes count as 1), without validating what follows.
size_t lead_len(unsigned char c) {
  static const size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[c >> 4];
}

// llama.cpp decodes text to code points before its regexes, turning each byte
// it cannot decode into U+FFFD (and not checking overlong forms): do the same
// so byte-level ids agree on invalid input too.
std::string lenient_utf8(std::string_view s) {
  if (utf8_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  auto cont = [&](size_t k) { return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80; };
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) n = 1, cp = c;
    else if ((c & 0xE0) == 0xC0 && cont(1)) n = 2, cp = (c & 0x1Fu) << 6 | (uint8_t(s[i + 1]) & 0x3Fu);
    else if ((c & 0xF0) == 0xE0 && cont(1) && cont(2))
      n = 3, cp = (c & 0x0Fu) << 12 | (uint8_t(s[i + 1]) & 0x3Fu) << 6 | (uint8_t(s[i + 2]) & 0x3Fu);
    else if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3))
      n = 4, cp = (c & 0x07u) << 18 | (uint8_t(s[i + 1]) & 0x3Fu) << 12 | (uint8_t(s[i + 2]) & 0x3Fu) << 6 |
                  (uint8_t(s[i + 3]) & 0x3Fu);
    if (n == 0) n = 1, cp = 0xFFFD;
    utf8_append(out, cp);
    i += n;
  }
  return out;
}

// One piece of the text after the special-token partition.
struct Frag {
  int32_t token;  // >= 0: a matched special token; -1: raw text [b, e)
  size_t b, e;
};

// llama.cpp's tokenizer_st_partition: for each special token, longest first,
// split every raw fragment on its leftmost non-overlapping occurrences.
std::vector<Frag> partition(const LlamaVocab& lv, const Bpe& bpe, std::string_view text, bool parse_special) {
  std::vector<Frag> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  std::vector<Frag> next;
  for (const int32_t id : lv.specials) {
    const int32_t ty = lv.type[size_t(id)];
    if (!parse_special && (ty == kControl || ty == kUnknown)) continue;
    const std::string& s = bpe.vocab[size_t(id)];
    next.clear();
    for (const Frag& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t off = f.b, len = f.e - f.b;
      while (len > 0) {
        const size_t pos = text.substr(0, off + len).find(s, off);
        if (pos == std::string_view::npos) break;
        size_t left = pos - off;
        if (lv.lstrip[size_t(id)])
          while (left > 0 && c_space(text[off + left - 1])) --left;
        if (left > 0) next.push_back({-1, off, off + left});
        next.push_back({id, 0, 0});
        size_t r_off = pos + s.size(), r_len = off + len - r_off;
        if (lv.rstrip[size_t(id)])
          while (r_len > 0 && c_space(text[r_off])) ++r_off, --r_len;
        off = r_off;
        len = r_len;
      }
      if (len > 0) next.push_back({-1, off, off + len});
    }
    frags.swap(next);
  }
  return frags;
}

int32_t byte_token(const LlamaVocab& lv, const Bpe& bpe, unsigned char c) {
  const int32_t id = bpe.byte_ids[c];
  if (id >= 0) return id;
  const int32_t raw = bpe.vocab_map.find(std::string_view(reinterpret_cast<const char*>(&c), 1));
  if (raw >= 0) return raw;
  fail("{}: the vocabulary has no byte token <0x{:02X}> for a character it cannot spell", lv.where, c);
}

}  // namespace

// SentencePiece as llama.cpp runs it: start from UTF-8 characters, repeatedly
// merge the adjacent pair whose concatenation is the highest-scoring token
// (ties: leftmost), then spell each symbol as its token or as byte tokens.
void LlamaVocab::spm_tokenize(const Impl& t, std::string_view text, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t prev, next;
    size_t off, n;  // bytes [off, off + n) of text; n = 0 once merged into its left neighbour
  };
  struct Bigram {
    float score;
    int32_t left, right;
    size_t size;
  };
  // priority_queue's top is the "largest": highest score, then smallest left.
  auto lower = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::vector<Sym> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(lead_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const auto idx = int32_t(sym.size());
    sym.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, off, n});
    off += n;
  }
  if (sym.empty()) return;
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const size_t size = sym[size_t(l)].n + sym[size_t(r)].n;
    const int32_t id = t.bpe.vocab_map.find(text.substr(sym[size_t(l)].off, size));
    if (id < 0) return;
    queue.push({scores[size_t(id)], l, r, size});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add(int32_t(i - 1), int32_t(i));
  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    Sym& left = sym[size_t(top.left)];
    Sym& right = sym[size_t(top.right)];
    // Stale: one side was merged since (sizes only grow, so equal sum = unchanged).
    if (left.n == 0 || right.n == 0 || left.n + right.n != top.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) sym[size_t(right.next)].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = sym[size_t(i)].next) {
    const std::string_view s = text.substr(sym[size_t(i)].off, sym[size_t(i)].n);
    const int32_t id = t.bpe.vocab_map.find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char c : s) out.push_back(byte_token(*this, t.bpe, static_cast<unsigned char>(c)));
  }
}

std::vector<int32_t> LlamaVocab::encode(const Impl& t, std::string_view text, bool add_special,
                                        bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special && add_bos && bos >= 0) ids.push_back(bos);
  bool prev_special = true;  // SPM: a space is prepended to text at the start or after a special token
  std::vector<std::pair<size_t, size_t>> spans, next;
  for (const Frag& f : partition(*this, t.bpe, text, parse_special)) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.b, f.e - f.b);
    if (spm) {
      std::string s = add_space_prefix && prev_special ? " " : "";
      s.append(raw);
      std::string escaped;
      escaped.reserve(s.size() + s.size() / 2);
      for (char c : s) {
        if (c == ' ') escaped.append(kSpace);
        else escaped.push_back(c);
      }
      if (!spm_cut || !utf8_valid(escaped)) {
        spm_tokenize(t, escaped, ids);
      } else {
        const std::string_view e = escaped;
        size_t seg = 0;
        for (size_t pos = e.find(kSpace, 1); pos != std::string_view::npos;
             pos = e.find(kSpace, pos + kSpace.size())) {
          const bool after_space = pos >= kSpace.size() && e.compare(pos - kSpace.size(), kSpace.size(), kSpace) == 0;
          if (after_space) continue;
          spm_tokenize(t, e.substr(seg, pos - seg), ids);
          seg = pos;
        }
        spm_tokenize(t, e.substr(seg), ids);
      }
      prev_special = false;
      continue;
    }
    // gpt2: each regex splits every current piece into matches and the gaps
    // between them (llama.cpp's unicode_regex_split), then byte-level BPE.
    const std::string s = lenient_utf8(raw);
    spans.assign(1, {0, s.size()});
    for (const auto& re : splits) {
      next.clear();
      for (const auto& span : spans) {
        // Plain names, not a structured binding: the lambda below captures
        // them, which clang 14 (the fuzz build) does not allow for bindings.
        const size_t b = span.first, e = span.second;
        size_t prev = b;
        re->for_each(std::string_view(s).substr(b, e - b), [&](size_t mb, size_t me) {
          if (b + mb > prev) next.emplace_back(prev, b + mb);
          next.emplace_back(b + mb, b + me);
          prev = b + me;
        });
        if (prev < e) next.emplace_back(prev, e);
      }
      spans.swap(next);
    }
    for (auto [b, e] : spans) t.bpe.tokenize(std::string_view(s).substr(b, e - b), ids);
  }
  if (add_special && add_eos && eos >= 0) ids.push_back(eos);
  return ids;
}

// llama.cpp's token_to_piece per id: control/unknown tokens only when not
// skipped, user-defined as written, normal SPM pieces with U+2581 -> ' ',
// byte tokens as their byte, normal gpt2 pieces mapped back to bytes. The
// prefix space is removed from the first emitted piece. The bytes are then
// read as lossy UTF-8.
std::string LlamaVocab::decode(const Impl& t, std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size)
      fail("tokenizer decode: token id {} is outside the vocabulary [0, {})", id, t.vocab_size);
    const int32_t ty = type[size_t(id)];
    if (skip_special && (ty == kControl || ty == kUnknown)) continue;
    const std::string& text = t.bpe.vocab[size_t(id)];
    const size_t mark = bytes.size();
    if (ty == kControl || ty == kUnknown || ty == kUser) {
      bytes += text;
    } else if (ty == kNormal && spm) {
      for (size_t pos = 0;;) {
        const size_t hit = text.find(kSpace, pos);
        bytes.append(text, pos, hit == std::string::npos ? std::string::npos : hit - pos);
        if (hit == std::string::npos) break;
        bytes.push_back(' ');
        pos = hit + kSpace.size();
      }
    } else if (ty == kNormal) {
      for (size_t i = 0; i < text.size();) {
        const size_t b = i;
        const int byte = byte_from_cp(utf8_next(text, i));
        if (byte >= 0) bytes.push_back(char(byte));
        else bytes.append(text, b, i - b);
      }
    } else if (ty == kByte && spm && text.size() == 6 && text.compare(0, 3, "<0x") == 0 &&
               std::isxdigit(static_cast<unsigned char>(text[3])) && std::isxdigit(static_cast<unsigned char>(text[4]))) {
      bytes.push_back(char(std::stoi(text.substr(3, 2), nullptr, 16)));
    }
    if (first && add_space_prefix && bytes.size() > mark && bytes[mark] == ' ') bytes.erase(mark, 1);
    first = false;
  }
  std::string out;
  append_lossy(out, bytes);
  return out;
}

}  // namespace tok_detail
}  // namespace ptllm
