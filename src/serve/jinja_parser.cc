// Recursive-descent parser. Precedence, loosest first (as in jinja2 / HF):
//   x if c else y  <  or  <  and  <  not  <  comparisons, in, not in  <  + - ~
//   <  * / // %  <  **  <  is-tests  <  |filters  <  unary + -  <  call, .attr, [index]
#include <algorithm>
#include <initializer_list>

#include "serve/jinja_ast.h"
#include "serve/jinja_error.h"

namespace ptllm::jinja {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& t, size_t end) : t_(t), end_(end) {}

  Block program() {
    Block out;
    while (i_ < t_.size()) out.push_back(any());
    return out;
  }

 private:
  const Token* peek(size_t k = 0) const { return i_ + k < t_.size() ? &t_[i_ + k] : nullptr; }
  size_t here() const { return i_ < t_.size() ? t_[i_].pos : end_; }
  bool is(Tok type, size_t k = 0) const { return peek(k) && peek(k)->type == type; }
  bool is_ident(const char* name, size_t k = 0) const { return is(Tok::Ident, k) && peek(k)->value == name; }
  bool is_statement(std::initializer_list<const char*> names) const {
    if (!is(Tok::OpenStatement) || !is(Tok::Ident, 1)) return false;
    for (const char* n : names)
      if (peek(1)->value == n) return true;
    return false;
  }
  [[noreturn]] void error(const std::string& msg) const { fail_at(here(), msg); }
  const Token& expect(Tok type, const char* what) {
    if (!is(type)) error(std::string("expected ") + what + (peek() ? ", got '" + peek()->value + "'" : ", got end of template"));
    return t_[i_++];
  }
  void expect_ident(const char* name) {
    if (!is_ident(name)) error(std::string("expected '") + name + "'");
    ++i_;
  }
  void expect_end_tag(const char* name) {
    expect(Tok::OpenStatement, (std::string("{% ") + name + " %}").c_str());
    expect_ident(name);
    expect(Tok::CloseStatement, "'%}'");
  }
  // Nesting limit: a template of 100k '(' must be an error, not a stack overflow.
  struct Nest {
    Nest(Parser& p) : p(p) {
      if (++p.depth_ > 1000) p.error("expression or block nests too deeply");
    }
    ~Nest() { --p.depth_; }
    Parser& p;
  };

  NodePtr node(NodeKind k, size_t pos) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->pos = pos;
    return n;
  }
  Block body_until(std::initializer_list<const char*> names, const char* opener, size_t start) {
    Block b;
    while (!is_statement(names)) {
      if (i_ >= t_.size()) fail_at(start, std::string("'") + opener + "' block is never closed");
      b.push_back(any());
    }
    return b;
  }

  NodePtr any() {
    Nest nest(*this);
    const Token& tok = t_[i_];
    switch (tok.type) {
      case Tok::Comment: {
        ++i_;
        return node(NodeKind::Comment, tok.pos);
      }
      case Tok::Text: {
        auto n = node(NodeKind::Text, tok.pos);
        n->text = tok.value;
        ++i_;
        return n;
      }
      case Tok::OpenStatement: return statement();
      case Tok::OpenExpression: {
        ++i_;
        auto e = expression();
        expect(Tok::CloseExpression, "'}}'");
        return e;
      }
      default: error("unexpected '" + tok.value + "' outside {{ }} / {% %}");
    }
  }

  NodePtr statement() {
    ++i_;  // {%
    if (!is(Tok::Ident)) error("expected a statement name after '{%'");
    const Token& name = t_[i_++];
    const std::string& w = name.value;
    NodePtr n;
    if (w == "set") {
      n = set_statement(name.pos);
    } else if (w == "if") {
      n = if_statement(name.pos);
      expect_end_tag("endif");
    } else if (w == "for") {
      n = for_statement(name.pos);
      expect_end_tag("endfor");
    } else if (w == "macro") {
      n = node(NodeKind::Macro, name.pos);
      if (!is(Tok::Ident)) error("expected a macro name");
      n->text = t_[i_++].value;
      n->kids = args(true);
      expect(Tok::CloseStatement, "'%}'");
      n->body = body_until({"endmacro"}, "macro", name.pos);
      expect_end_tag("endmacro");
    } else if (w == "call") {
      n = node(NodeKind::CallBlock, name.pos);
      Block caller_params;
      if (is(Tok::OpenParen)) caller_params = args(true);
      auto callee = primary();
      if (callee->kind != NodeKind::Ident) error("expected a macro name after 'call'");
      auto call = node(NodeKind::Call, callee->pos);
      call->kids.push_back(std::move(callee));
      for (auto& a : args(false)) call->kids.push_back(std::move(a));
      n->kids.push_back(std::move(call));
      for (auto& p : caller_params) n->kids.push_back(std::move(p));
      expect(Tok::CloseStatement, "'%}'");
      n->body = body_until({"endcall"}, "call", name.pos);
      expect_end_tag("endcall");
    } else if (w == "break" || w == "continue") {
      n = node(w == "break" ? NodeKind::Break : NodeKind::Continue, name.pos);
      expect(Tok::CloseStatement, "'%}'");
    } else if (w == "filter") {
      n = node(NodeKind::FilterBlock, name.pos);
      auto f = primary();
      if (f->kind != NodeKind::Ident) error("expected a filter name after 'filter'");
      if (is(Tok::OpenParen)) f = call(std::move(f));
      n->kids.push_back(std::move(f));
      expect(Tok::CloseStatement, "'%}'");
      n->body = body_until({"endfilter"}, "filter", name.pos);
      expect_end_tag("endfilter");
    } else {
      fail_at(name.pos, "unknown statement '" + w + "'");
    }
    return n;
  }

  NodePtr set_statement(size_t pos) {
    auto n = node(NodeKind::Set, pos);
    n->kids.push_back(sequence(false));
    if (is(Tok::Equals)) {
      ++i_;
      n->kids.push_back(sequence(false));
    } else {
      expect(Tok::CloseStatement, "'=' or '%}'");
      n->body = body_until({"endset"}, "set", pos);
      expect(Tok::OpenStatement, "'{%'");
      expect_ident("endset");
    }
    expect(Tok::CloseStatement, "'%}'");
    return n;
  }

  NodePtr if_statement(size_t pos) {
    auto n = node(NodeKind::If, pos);
    n->kids.push_back(expression());
    expect(Tok::CloseStatement, "'%}'");
    n->body = body_until({"elif", "else", "endif"}, "if", pos);
    if (is_statement({"elif"})) {
      i_ += 2;
      n->orelse.push_back(if_statement(t_[i_ - 1].pos));
    } else if (is_statement({"else"})) {
      i_ += 2;
      expect(Tok::CloseStatement, "'%}'");
      n->orelse = body_until({"endif"}, "if", pos);
    }
    return n;
  }

  NodePtr for_statement(size_t pos) {
    auto n = node(NodeKind::For, pos);
    auto target = sequence(true);
    if (target->kind != NodeKind::Ident && target->kind != NodeKind::TupleLit)
      error("expected a loop variable (name or tuple of names)");
    if (!is_ident("in")) error("expected 'in' after the loop variable");
    ++i_;
    n->kids.push_back(std::move(target));
    n->kids.push_back(expression());
    expect(Tok::CloseStatement, "'%}'");
    n->body = body_until({"endfor", "else"}, "for", pos);
    if (is_statement({"else"})) {
      i_ += 2;
      expect(Tok::CloseStatement, "'%}'");
      n->orelse = body_until({"endfor"}, "for", pos);
    }
    return n;
  }

  // a, b, c -> tuple; a -> a.
  NodePtr sequence(bool primary_only) {
    size_t pos = here();
    auto first = primary_only ? primary() : expression();
    if (!is(Tok::Comma)) return first;
    auto tup = node(NodeKind::TupleLit, pos);
    tup->kids.push_back(std::move(first));
    while (is(Tok::Comma)) {
      ++i_;
      tup->kids.push_back(primary_only ? primary() : expression());
    }
    return tup;
  }

  NodePtr expression() {
    Nest nest(*this);
    size_t pos = here();
    auto a = logical_or();
    if (!is_ident("if")) return a;
    ++i_;
    auto test = logical_or();
    if (is_ident("else")) {
      ++i_;
      auto n = node(NodeKind::Ternary, pos);
      n->kids.push_back(std::move(test));
      n->kids.push_back(std::move(a));
      n->kids.push_back(expression());
      return n;
    }
    auto n = node(NodeKind::Select, pos);
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(test));
    return n;
  }

  NodePtr binary(std::string op, size_t pos, NodePtr l, NodePtr r) {
    auto n = node(NodeKind::Binary, pos);
    n->text = std::move(op);
    n->kids.push_back(std::move(l));
    n->kids.push_back(std::move(r));
    return n;
  }

  NodePtr logical_or() {
    auto left = logical_and();
    while (is_ident("or")) {
      size_t pos = t_[i_++].pos;
      left = binary("or", pos, std::move(left), logical_and());
    }
    return left;
  }
  NodePtr logical_and() {
    auto left = logical_not();
    while (is_ident("and")) {
      size_t pos = t_[i_++].pos;
      left = binary("and", pos, std::move(left), logical_not());
    }
    return left;
  }
  NodePtr logical_not() {
    Nest nest(*this);
    if (!is_ident("not")) return comparison();
    auto n = node(NodeKind::Unary, t_[i_++].pos);
    n->text = "not";
    n->kids.push_back(logical_not());
    return n;
  }
  NodePtr comparison() {
    auto left = additive();
    for (;;) {
      std::string op;
      size_t pos = here();
      if (is_ident("not") && is_ident("in", 1)) {
        op = "not in";
        i_ += 2;
      } else if (is_ident("in") || is(Tok::Comparison)) {
        op = t_[i_++].value;
      } else {
        return left;
      }
      left = binary(op, pos, std::move(left), additive());
    }
  }
  NodePtr additive() {
    auto left = multiplicative();
    while (is(Tok::Additive)) {
      const Token& op = t_[i_++];
      left = binary(op.value, op.pos, std::move(left), multiplicative());
    }
    return left;
  }
  NodePtr multiplicative() {
    auto left = power();
    while (is(Tok::Multiplicative)) {
      const Token& op = t_[i_++];
      left = binary(op.value, op.pos, std::move(left), power());
    }
    return left;
  }
  NodePtr power() {
    auto left = test();
    while (is(Tok::Power)) {
      const Token& op = t_[i_++];
      left = binary(op.value, op.pos, std::move(left), test());
    }
    return left;
  }
  NodePtr test() {
    auto operand = filter();
    while (is_ident("is")) {
      size_t pos = t_[i_++].pos;
      bool negate = is_ident("not");
      if (negate) ++i_;
      if (!is(Tok::Ident)) error("expected a test name after 'is'");
      auto n = node(NodeKind::Test, pos);
      n->text = t_[i_++].value;
      n->flag = negate;
      n->kids.push_back(std::move(operand));
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr filter() {
    auto operand = unary_sign();
    while (is(Tok::Pipe)) {
      size_t pos = t_[i_++].pos;
      auto f = primary();
      if (f->kind != NodeKind::Ident) error("expected a filter name after '|'");
      if (is(Tok::OpenParen)) f = call(std::move(f));
      auto n = node(NodeKind::Filter, pos);
      n->kids.push_back(std::move(operand));
      n->kids.push_back(std::move(f));
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr unary_sign() {
    Nest nest(*this);
    if ((is(Tok::Unary) || is(Tok::Additive)) && (peek()->value == "-" || peek()->value == "+")) {
      auto n = node(NodeKind::Unary, t_[i_].pos);
      n->text = t_[i_++].value;
      n->kids.push_back(unary_sign());
      return n;
    }
    auto m = member(primary());
    if (is(Tok::OpenParen)) return call(std::move(m));
    return m;
  }
  NodePtr call(NodePtr callee) {
    auto n = node(NodeKind::Call, callee->pos);
    n->kids.push_back(std::move(callee));
    for (auto& a : args(false)) n->kids.push_back(std::move(a));
    NodePtr e = member(std::move(n));
    if (is(Tok::OpenParen)) return call(std::move(e));
    return e;
  }

  // (a, b, k=v): keyword arguments after positional ones; in a macro
  // signature only names and name=default.
  Block args(bool params) {
    expect(Tok::OpenParen, "'('");
    Block out;
    bool saw_keyword = false;
    while (!is(Tok::CloseParen)) {
      if (i_ >= t_.size()) error("argument list is never closed with ')'");
      auto a = expression();
      if (is(Tok::Equals)) {
        ++i_;
        if (a->kind != NodeKind::Ident) fail_at(a->pos, "expected a name before '='");
        auto kw = node(NodeKind::KwArg, a->pos);
        kw->text = a->text;
        kw->kids.push_back(expression());
        a = std::move(kw);
        saw_keyword = true;
      } else if (saw_keyword) {
        fail_at(a->pos, params ? "parameter without default after one with a default"
                               : "positional argument after a keyword argument");
      }
      if (params && a->kind != NodeKind::Ident && a->kind != NodeKind::KwArg)
        fail_at(a->pos, "expected a parameter name");
      out.push_back(std::move(a));
      if (is(Tok::Comma)) ++i_;
    }
    ++i_;
    return out;
  }

  NodePtr member(NodePtr object) {
    while (is(Tok::Dot) || is(Tok::OpenSquare)) {
      const Token& op = t_[i_++];
      auto n = node(NodeKind::Member, op.pos);
      n->flag = op.type == Tok::OpenSquare;
      n->kids.push_back(std::move(object));
      if (n->flag) {
        n->kids.push_back(subscript(op.pos));
        expect(Tok::CloseSquare, "']'");
      } else {
        auto p = primary();
        if (p->kind != NodeKind::Ident && p->kind != NodeKind::Int) fail_at(p->pos, "expected a name after '.'");
        n->kids.push_back(std::move(p));
      }
      object = std::move(n);
    }
    return object;
  }
  // [i] or a slice [a:b:c] with any part omitted.
  NodePtr subscript(size_t pos) {
    Block parts;
    bool slice = false;
    while (!is(Tok::CloseSquare)) {
      if (i_ >= t_.size()) error("'[' is never closed");
      if (is(Tok::Colon)) {
        parts.push_back(nullptr);
        ++i_;
        slice = true;
      } else {
        parts.push_back(expression());
        if (is(Tok::Colon)) {
          ++i_;
          slice = true;
        }
      }
    }
    if (parts.empty()) fail_at(pos, "empty subscript '[]'");
    if (!slice) return std::move(parts[0]);
    if (parts.size() > 3) fail_at(pos, "a slice has at most 3 parts");
    auto n = node(NodeKind::Slice, pos);
    n->kids = std::move(parts);
    n->kids.resize(3);
    return n;
  }

  NodePtr primary() {
    if (i_ >= t_.size()) error("expected an expression, got end of template");
    const Token& tok = t_[i_++];
    switch (tok.type) {
      case Tok::Number: {
        bool is_float = tok.value.find('.') != std::string::npos;
        auto n = node(is_float ? NodeKind::Float : NodeKind::Int, tok.pos);
        try {
          if (is_float) n->fval = std::stod(tok.value);
          else n->ival = std::stoll(tok.value);
        } catch (const std::exception&) {
          fail_at(tok.pos, "number '" + tok.value + "' is out of range");
        }
        return n;
      }
      case Tok::String: {
        auto n = node(NodeKind::Str, tok.pos);
        n->text = tok.value;
        while (is(Tok::String)) n->text += t_[i_++].value;  // "a" "b" concatenates
        return n;
      }
      case Tok::Ident: {
        auto n = node(NodeKind::Ident, tok.pos);
        n->text = tok.value;
        return n;
      }
      case Tok::OpenParen: {
        auto e = sequence(false);
        expect(Tok::CloseParen, "')'");
        return e;
      }
      case Tok::OpenSquare: {
        auto n = node(NodeKind::ArrayLit, tok.pos);
        while (!is(Tok::CloseSquare)) {
          if (i_ >= t_.size()) fail_at(tok.pos, "'[' is never closed");
          n->kids.push_back(expression());
          if (is(Tok::Comma)) ++i_;
        }
        ++i_;
        return n;
      }
      case Tok::OpenCurly: {
        auto n = node(NodeKind::DictLit, tok.pos);
        while (!is(Tok::CloseCurly)) {
          if (i_ >= t_.size()) fail_at(tok.pos, "'{' is never closed");
          n->kids.push_back(expression());
          expect(Tok::Colon, "':' between key and value");
          n->kids.push_back(expression());
          if (is(Tok::Comma)) ++i_;
        }
        ++i_;
        return n;
      }
      default: fail_at(tok.pos, "unexpected '" + tok.value + "'");
    }
  }

  const std::vector<Token>& t_;
  size_t end_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Block parse(const std::vector<Token>& tokens, size_t source_size) { return Parser(tokens, source_size).program(); }

}  // namespace ptllm::jinja
