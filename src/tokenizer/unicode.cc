// UTF-8 helpers, Unicode properties and normalization (ICU), and the GPT-2
// byte-level alphabet.
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <array>
#include <cstring>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace ptllm::tok_detail {

size_t utf8_char_len(const unsigned char* p, size_t n, size_t* bad, bool* truncated) {
  *truncated = false;
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;  // no overlongs
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= n) {
      *truncated = true;
      *bad = k;
      return 0;
    }
    const unsigned b = p[k];
    const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *bad = k;
      return 0;
    }
  }
  return need + 1;
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    ++i;
    return p[0];
  }
  size_t bad = 0;
  bool trunc = false;
  size_t len = utf8_char_len(p, s.size() - i, &bad, &trunc);
  if (len == 0) {
    ++i;
    return 0xFFFFFFFFu;
  }
  uint32_t cp;
  if (len == 2) {
    cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  } else if (len == 3) {
    cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  } else {
    cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
  i += len;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool utf8_valid(std::string_view s, size_t* first_bad, bool* truncated) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    bool trunc = false;
    size_t len = utf8_char_len(p + i, s.size() - i, &bad, &trunc);
    if (len == 0) {
      if (first_bad) *first_bad = i;
      if (truncated) *truncated = trunc;
      return false;
    }
    i += len;
  }
  if (truncated) *truncated = false;
  return true;
}

void append_lossy(std::string& out, std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0, run = 0;  // [run, i) is a pending valid run
  while (i < bytes.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    bool trunc = false;
    size_t len = utf8_char_len(p + i, bytes.size() - i, &bad, &trunc);
    if (len) {
      i += len;
      continue;
    }
    out.append(bytes.data() + run, i - run);
    out.append("\xEF\xBF\xBD");  // one U+FFFD per maximal ill-formed subpart
    i += bad;
    run = i;
  }
  out.append(bytes.data() + run, i - run);
}

bool utf8_ends_incomplete(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  // A character is at most 4 bytes, so only the last 3 can start an
  // unfinished one.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = p[n - back];
    if (c < 0x80) return false;
    if (c >= 0xC0) {  // lead byte (or invalid one)
      size_t bad = 0;
      bool trunc = false;
      utf8_char_len(p + n - back, back, &bad, &trunc);
      return trunc;
    }
  }
  return false;
}

bool is_white_space(uint32_t cp) { return cp != 0xFFFFFFFFu && u_isUWhiteSpace(UChar32(cp)); }

bool is_word_char(uint32_t cp) {
  if (cp == 0xFFFFFFFFu) return false;
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  const UChar32 c = UChar32(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  const int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

bool is_numeric(uint32_t cp) {
  if (cp == 0xFFFFFFFFu) return false;
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const int8_t t = u_charType(UChar32(cp));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

namespace {

bool all_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Applies `fn` (valid UTF-8 -> UTF-8) to each maximal valid run of `s`, passing
// ill-formed bytes through untouched (they only occur with byte fallback /
// byte-level tokenizers, which accept arbitrary bytes).
template <typename Fn>
std::string per_valid_run(std::string_view s, Fn&& fn) {
  std::string out;
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size()) {
      if (p[j] < 0x80) {
        ++j;
        continue;
      }
      size_t bad = 0;
      bool trunc = false;
      size_t len = utf8_char_len(p + j, s.size() - j, &bad, &trunc);
      if (!len) break;
      j += len;
    }
    if (j > i) out += fn(s.substr(i, j - i));
    if (j < s.size()) {
      out.push_back(s[j]);
      ++j;
    }
    i = j;
  }
  return out;
}

std::u16string to_u16(std::string_view s) {
  std::u16string w(s.size() + 1, u'\0');
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strFromUTF8(reinterpret_cast<UChar*>(w.data()), int32_t(w.size()), &len, s.data(), int32_t(s.size()), &err);
  if (U_FAILURE(err)) fail("tokenizer: ICU UTF-8 -> UTF-16 conversion failed ({})", u_errorName(err));
  w.resize(size_t(len));
  return w;
}

std::string from_u16(const std::u16string& w) {
  std::string s(w.size() * 3 + 1, '\0');
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  u_strToUTF8(s.data(), int32_t(s.size()), &len, reinterpret_cast<const UChar*>(w.data()), int32_t(w.size()), &err);
  if (U_FAILURE(err)) fail("tokenizer: ICU UTF-16 -> UTF-8 conversion failed ({})", u_errorName(err));
  s.resize(size_t(len));
  return s;
}

}  // namespace

std::string unicode_normalize(std::string_view s, NormForm form) {
  if (all_ascii(s)) return std::string(s);  // ASCII is invariant under all four forms
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = nullptr;
  switch (form) {
    case NormForm::NFC: norm = unorm2_getNFCInstance(&err); break;
    case NormForm::NFD: norm = unorm2_getNFDInstance(&err); break;
    case NormForm::NFKC: norm = unorm2_getNFKCInstance(&err); break;
    case NormForm::NFKD: norm = unorm2_getNFKDInstance(&err); break;
  }
  if (U_FAILURE(err)) fail("tokenizer: ICU normalizer unavailable ({})", u_errorName(err));
  return per_valid_run(s, [&](std::string_view run) {
    std::u16string w = to_u16(run);
    UErrorCode e = U_ZERO_ERROR;
    int32_t cap = int32_t(w.size() * 4 + 16);  // decompositions can grow (<= 18x worst case, retried below)
    std::u16string out(size_t(cap), u'\0');
    int32_t len = unorm2_normalize(norm, reinterpret_cast<const UChar*>(w.data()), int32_t(w.size()),
                                   reinterpret_cast<UChar*>(out.data()), cap, &e);
    if (e == U_BUFFER_OVERFLOW_ERROR) {
      e = U_ZERO_ERROR;
      out.assign(size_t(len), u'\0');
      len = unorm2_normalize(norm, reinterpret_cast<const UChar*>(w.data()), int32_t(w.size()),
                             reinterpret_cast<UChar*>(out.data()), len, &e);
    }
    if (U_FAILURE(e)) fail("tokenizer: ICU normalization failed ({})", u_errorName(e));
    out.resize(size_t(len));
    return from_u16(out);
  });
}

std::string unicode_lowercase(std::string_view s) {
  if (all_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return out;
  }
  return per_valid_run(s, [&](std::string_view run) {
    std::u16string w = to_u16(run);
    UErrorCode e = U_ZERO_ERROR;
    std::u16string out(w.size() * 3 + 16, u'\0');
    int32_t len = u_strToLower(reinterpret_cast<UChar*>(out.data()), int32_t(out.size()),
                               reinterpret_cast<const UChar*>(w.data()), int32_t(w.size()), "", &e);
    if (e == U_BUFFER_OVERFLOW_ERROR) {
      e = U_ZERO_ERROR;
      out.assign(size_t(len), u'\0');
      len = u_strToLower(reinterpret_cast<UChar*>(out.data()), len, reinterpret_cast<const UChar*>(w.data()),
                         int32_t(w.size()), "", &e);
    }
    if (U_FAILURE(e)) fail("tokenizer: ICU lowercase failed ({})", u_errorName(e));
    out.resize(size_t(len));
    return from_u16(out);
  });
}

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // all mapped code points are < 256 + 68
  ByteMap() {
    from_cp.fill(-1);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes map to themselves; the rest are shifted past
      // U+00FF so every byte becomes a visible character.
      const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = keep ? b : 256 + extra++;
      from_cp[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const uint32_t* byte_to_cp() { return byte_map().to_cp.data(); }
int byte_from_cp(uint32_t cp) { return cp < 324 ? byte_map().from_cp[cp] : -1; }

}  // namespace ptllm::tok_detail
