#include "serve/jinja_lexer.h"

#include <cstdint>

#include "serve/jinja_error.h"
#include "serve/jinja_value.h"

namespace ptllm::jinja {

bool is_space_at(const std::string& s, size_t i, size_t* len) {
  auto c = uint8_t(s[i]);
  *len = 1;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return true;
  if (c < 0x80) return false;
  // Unicode spaces: U+00A0, U+1680, U+2000..U+200A, U+2028/9, U+202F,
  // U+205F, U+3000, U+FEFF (the set JavaScript's trim() removes).
  auto b = [&](size_t k) { return i + k < s.size() ? uint8_t(s[i + k]) : uint8_t(0); };
  if (c == 0xC2 && b(1) == 0xA0) return *len = 2, true;
  if (c == 0xE1 && b(1) == 0x9A && b(2) == 0x80) return *len = 3, true;
  if (c == 0xE2 && b(1) == 0x80 && ((b(2) >= 0x80 && b(2) <= 0x8A) || b(2) == 0xA8 || b(2) == 0xA9 || b(2) == 0xAF))
    return *len = 3, true;
  if (c == 0xE2 && b(1) == 0x81 && b(2) == 0x9F) return *len = 3, true;
  if (c == 0xE3 && b(1) == 0x80 && b(2) == 0x80) return *len = 3, true;
  if (c == 0xEF && b(1) == 0xBB && b(2) == 0xBF) return *len = 3, true;
  return false;
}

std::string trim_start(const std::string& s) {
  size_t i = 0, len = 0;
  while (i < s.size() && is_space_at(s, i, &len)) i += len;
  return s.substr(i);
}

std::string trim_end(const std::string& s) {
  // Scan forward (UTF-8 cannot be decoded backwards safely): remember where
  // the last run of spaces began.
  size_t i = 0, len = 0, end = 0;
  while (i < s.size()) {
    if (is_space_at(s, i, &len)) {
      i += len;
    } else {
      i += 1;
      end = i;
    }
  }
  return s.substr(0, end);
}

namespace {

// The preprocessed text with, for every byte, its offset in the original.
struct Source {
  std::string text;
  std::vector<size_t> orig;
};

Source preprocess(const std::string& in) {
  Source a;
  size_t n = in.size();
  if (n > 0 && in[n - 1] == '\n') --n;
  // lstrip_blocks: drop [ \t]* between a line start and "{%", "{#", "{-".
  for (size_t i = 0; i < n;) {
    bool line_start = i == 0 || in[i - 1] == '\n';
    if (line_start) {
      size_t j = i;
      while (j < n && (in[j] == ' ' || in[j] == '\t')) ++j;
      if (j + 1 < n && in[j] == '{' && (in[j + 1] == '%' || in[j + 1] == '#' || in[j + 1] == '-')) i = j;
    }
    size_t stop = i;
    do {
      a.text += in[stop];
      a.orig.push_back(stop);
      ++stop;
    } while (stop < n && in[stop - 1] != '\n');
    i = stop;
  }
  // trim_blocks: drop the newline right after "%}", "#}", "-}".
  Source b;
  const std::string& t = a.text;
  for (size_t i = 0; i < t.size(); ++i) {
    b.text += t[i];
    b.orig.push_back(a.orig[i]);
    if (t[i] == '}' && i > 0 && (t[i - 1] == '%' || t[i - 1] == '#' || t[i - 1] == '-') && i + 1 < t.size() &&
        t[i + 1] == '\n')
      ++i;
  }
  b.orig.push_back(in.size());  // end of input
  return b;
}

bool is_word(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }


class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(preprocess(source)), s_(src_.text) {}

  std::vector<Token> run() {
    while (i_ < s_.size()) step();
    return std::move(tokens_);
  }

 private:
  size_t orig(size_t i) const { return src_.orig[std::min(i, src_.orig.size() - 1)]; }
  [[noreturn]] void error(const std::string& msg) const { fail_at(orig(i_), msg); }
  bool at(const char* lit) const { return s_.compare(i_, std::char_traits<char>::length(lit), lit) == 0; }
  Tok last() const { return tokens_.empty() ? Tok::Text : tokens_.back().type; }
  void push(Tok t, std::string v, size_t start) { tokens_.push_back({t, std::move(v), orig(start)}); }

  void strip_trailing_text() {
    if (!tokens_.empty() && tokens_.back().type == Tok::Text) {
      tokens_.back().value = trim_end(tokens_.back().value);
      if (tokens_.back().value.empty()) tokens_.pop_back();
    }
  }
  void skip_spaces() {
    size_t len = 0;
    while (i_ < s_.size() && is_space_at(s_, i_, &len)) i_ += len;
  }
  bool tag_open_at(size_t i) const {
    return s_[i] == '{' && i + 1 < s_.size() && (s_[i + 1] == '%' || s_[i + 1] == '{' || s_[i + 1] == '#');
  }

  void step() {
    bool text_allowed = tokens_.empty() || last() == Tok::CloseStatement || last() == Tok::CloseExpression ||
                        last() == Tok::Comment;
    if (text_allowed) {
      size_t start = i_;
      while (i_ < s_.size() && !tag_open_at(i_)) ++i_;
      if (i_ > start) {
        push(Tok::Text, s_.substr(start, i_ - start), start);
        return;
      }
    }
    if (at("{#")) return comment();
    if (at("{%-") || at("{{-")) {
      strip_trailing_text();
      bool stmt = s_[i_ + 1] == '%';
      push(stmt ? Tok::OpenStatement : Tok::OpenExpression, stmt ? "{%" : "{{", i_);
      if (!stmt) curly_ = 0;
      i_ += 3;
      return;
    }
    skip_spaces();
    if (i_ >= s_.size()) return;
    if (at("-%}") || at("-}}")) {
      bool stmt = s_[i_ + 1] == '%';
      push(stmt ? Tok::CloseStatement : Tok::CloseExpression, stmt ? "%}" : "}}", i_);
      i_ += 3;
      skip_spaces();
      return;
    }
    char c = s_[i_];
    if ((c == '-' || c == '+') && !tokens_.empty() && last() != Tok::Text) {
      Tok l = last();
      bool binary = l == Tok::Ident || l == Tok::Number || l == Tok::String || l == Tok::CloseParen ||
                    l == Tok::CloseSquare;
      if (!binary) return unary_sign(c);
    } else if (c == '-' || c == '+') {
      error(std::string("unexpected character '") + c + "'");
    }
    if (symbol()) return;
    if (c == '\'' || c == '"') return string_literal(c);
    if (is_digit(c)) return number();
    if (is_word(c)) {
      size_t start = i_;
      while (i_ < s_.size() && is_word(s_[i_])) ++i_;
      push(Tok::Ident, s_.substr(start, i_ - start), start);
      return;
    }
    error(std::string("unexpected character '") + c + "'");
  }

  void comment() {
    size_t start = i_;
    i_ += 2;
    bool strip_before = i_ < s_.size() && s_[i_] == '-';
    if (strip_before) ++i_;
    size_t body = i_;
    while (!(i_ + 1 < s_.size() && s_[i_] == '#' && s_[i_ + 1] == '}')) {
      if (i_ + 1 >= s_.size()) fail_at(orig(start), "comment '{#' is never closed with '#}'");
      ++i_;
    }
    std::string text = s_.substr(body, i_ - body);
    bool strip_after = !text.empty() && text.back() == '-';
    if (strip_after) text.pop_back();
    if (strip_before) strip_trailing_text();
    push(Tok::Comment, text, start);
    i_ += 2;
    if (strip_after) skip_spaces();
  }

  void unary_sign(char c) {
    size_t start = i_++;
    std::string num;
    while (i_ < s_.size() && is_digit(s_[i_])) num += s_[i_++];
    if (!num.empty() && i_ + 1 < s_.size() && s_[i_] == '.' && is_digit(s_[i_ + 1])) {
      num += s_[i_++];
      while (i_ < s_.size() && is_digit(s_[i_])) num += s_[i_++];
    }
    if (num.empty()) push(Tok::Unary, std::string(1, c), start);
    else push(Tok::Number, std::string(1, c) + num, start);
  }

  bool symbol() {
    struct Sym {
      const char* text;
      Tok type;
    };
    static const Sym table[] = {
        {"{%", Tok::OpenStatement}, {"%}", Tok::CloseStatement}, {"{{", Tok::OpenExpression},
        {"}}", Tok::CloseExpression}, {"(", Tok::OpenParen}, {")", Tok::CloseParen}, {"{", Tok::OpenCurly},
        {"}", Tok::CloseCurly}, {"[", Tok::OpenSquare}, {"]", Tok::CloseSquare}, {",", Tok::Comma},
        {".", Tok::Dot}, {":", Tok::Colon}, {"|", Tok::Pipe}, {"<=", Tok::Comparison}, {">=", Tok::Comparison},
        {"==", Tok::Comparison}, {"!=", Tok::Comparison}, {"<", Tok::Comparison}, {">", Tok::Comparison},
        {"+", Tok::Additive}, {"-", Tok::Additive}, {"~", Tok::Additive}, {"**", Tok::Power},
        {"*", Tok::Multiplicative}, {"//", Tok::Multiplicative}, {"/", Tok::Multiplicative},
        {"%", Tok::Multiplicative}, {"=", Tok::Equals}};
    for (const auto& sym : table) {
      // Inside a dict literal "}}" closes two dicts, not the expression.
      if (sym.type == Tok::CloseExpression && curly_ > 0) continue;
      if (!at(sym.text)) continue;
      push(sym.type, sym.text, i_);
      if (sym.type == Tok::OpenExpression) curly_ = 0;
      if (sym.type == Tok::OpenCurly) ++curly_;
      if (sym.type == Tok::CloseCurly) --curly_;
      i_ += std::char_traits<char>::length(sym.text);
      return true;
    }
    return false;
  }

  void string_literal(char quote) {
    size_t start = i_++;
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail_at(orig(start), "string literal is never closed");
      char c = s_[i_];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      if (++i_ >= s_.size()) fail_at(orig(start), "string literal is never closed");
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'x':
        case 'u': {
          size_t len = e == 'x' ? 2 : 4;
          std::string hex = s_.substr(i_, len);
          if (hex.size() != len || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
            error("invalid escape \\" + std::string(1, e) + hex + " in string literal");
          append_utf8(out, uint32_t(std::stoul(hex, nullptr, 16)));
          i_ += len;
          break;
        }
        default: error(std::string("unknown escape \\") + e + " in string literal");
      }
    }
    ++i_;
    push(Tok::String, out, start);
  }

  void number() {
    size_t start = i_;
    while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
    if (last() != Tok::Dot && i_ + 1 < s_.size() && s_[i_] == '.' && is_digit(s_[i_ + 1])) {
      ++i_;
      while (i_ < s_.size() && is_digit(s_[i_])) ++i_;
    }
    push(Tok::Number, s_.substr(start, i_ - start), start);
  }

  Source src_;
  const std::string& s_;
  size_t i_ = 0;
  int curly_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace ptllm::jinja
