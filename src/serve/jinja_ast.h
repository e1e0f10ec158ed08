// Jinja syntax tree: one node type with a kind tag; children by role.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serve/jinja_lexer.h"

namespace ptllm::jinja {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Block = std::vector<NodePtr>;

enum class NodeKind {
  // statements
  Text, Comment, If, For, Set, Macro, CallBlock, FilterBlock, Break, Continue,
  // expressions
  Int, Float, Str, Ident, ArrayLit, TupleLit, DictLit, Member, Slice, Call, KwArg, Unary, Binary,
  Filter, Test, Select, Ternary
};

// Roles of `kids` per kind:
//   If: [test]; body / orelse.         For: [target, iterable] (iterable may be a Select); body / orelse.
//   Set: [target, value?]; body (set block when there is no value).
//   Macro: params (Ident / KwArg defaults); body.   CallBlock: [call, caller params...]; body.
//   FilterBlock: [filter (Ident / Call)]; body.
//   ArrayLit / TupleLit: items.   DictLit: key, value, key, value, ...
//   Member: [object, property]; flag = computed ([...]).   Slice: [start?, stop?, step?].
//   Call: [callee, args...] (KwArg nodes for keywords).    KwArg: [value]; text = name.
//   Unary: [operand]; text = op.  Binary: [left, right]; text = op.
//   Filter: [operand, filter (Ident / Call)].  Test: [operand]; text = test; flag = negated.
//   Select: [value, condition] ("x if c" without else).  Ternary: [condition, then, else].
struct Node {
  NodeKind kind;
  size_t pos = 0;  // offset in the template source, for error messages
  std::string text;
  int64_t ival = 0;
  double fval = 0;
  bool flag = false;
  std::vector<NodePtr> kids;  // null entries allowed in Slice
  Block body, orelse;
};

// Parses a whole template; throws TemplateError with the offending offset.
Block parse(const std::vector<Token>& tokens, size_t source_size);

}  // namespace ptllm::jinja
