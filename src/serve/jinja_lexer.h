// Jinja lexer: template text -> tokens.
//
// Whitespace handling is HF's (transformers renders with trim_blocks and
// lstrip_blocks): one trailing newline of the template is dropped; spaces and
// tabs from a line start up to "{%", "{#" (or "{-") are removed; the newline
// right after "%}", "#}" (or "-}") is removed; "{%-" / "{{-" / "{#-" trim the
// whitespace before the tag and "-%}" / "-}}" / "-#}" the whitespace after it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace ptllm::jinja {

enum class Tok {
  Text, Number, String, Ident, Equals, OpenParen, CloseParen, OpenStatement, CloseStatement,
  OpenExpression, CloseExpression, OpenSquare, CloseSquare, OpenCurly, CloseCurly, Comma, Dot,
  Colon, Pipe, Additive, Multiplicative, Power, Comparison, Unary, Comment
};

struct Token {
  Tok type;
  std::string value;
  size_t pos;  // byte offset in the original (not preprocessed) template
};

std::vector<Token> tokenize(const std::string& source);

// Whitespace as JavaScript's \s / trim() see it (ASCII and Unicode spaces).
bool is_space_at(const std::string& s, size_t i, size_t* len);
std::string trim_start(const std::string& s);
std::string trim_end(const std::string& s);

}  // namespace ptllm::jinja
