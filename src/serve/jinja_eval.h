// The evaluator (internal to the engine): scopes, statements, expressions.
// Builtins (filters, tests, methods, globals) live in jinja_builtins.cc.
#pragma once
#include <ctime>
#include <functional>
#include <string>
#include <unordered_map>

#include "serve/jinja_ast.h"
#include "serve/jinja_value.h"

namespace ptllm::jinja {

// A scope. Lookups walk to the parent; `set` writes here. A for loop gets its
// own scope (so {% set %} inside a loop does not leak out, as in jinja2); a
// macro call gets a scope whose parent is the caller's (HF's rule).
struct Env {
  explicit Env(Env* parent = nullptr) : parent(parent) {}
  Env* parent;
  std::unordered_map<std::string, Value> vars;
  Value lookup(const std::string& name) const {
    for (const Env* e = this; e; e = e->parent) {
      auto it = e->vars.find(name);
      if (it != e->vars.end()) return it->second;
    }
    return Value();
  }
  void set(const std::string& name, Value v) { vars[name] = std::move(v); }
};

class Interpreter {
 public:
  // Renders a block: the printed text of every statement/expression in it.
  std::string render(const Block& block, Env& env);
  Value eval(const Node& n, Env& env);
  CallArgs eval_args(const Node& call, size_t first, Env& env);

 private:
  Value eval_expr(const Node& n, Env& env);
  Value eval_for(const Node& n, Env& env);
  void eval_set(const Node& n, Env& env);
  Value eval_member(const Node& n, Env& env);
  Value eval_slice(const Value& obj, const Node& slice, Env& env);
  Value eval_binary(const Node& n, Env& env);
  Value eval_unary(const Node& n, Env& env);
  Value eval_call_block(const Node& n, Env& env);
  Value make_macro(const Node& n);
  void bind_params(const std::string& name, const std::vector<const Node*>& params, bool takes_kwargs,
                   bool takes_varargs, CallArgs& args, Env& scope);
  int depth_ = 0;
};

// jinja_builtins.cc
Value apply_filter(Interpreter& in, const Value& operand, const Node& filter, Env& env);
bool apply_test(const std::string& name, const Value& operand, const Value* arg = nullptr);
// A property of a non-container value: string methods, list .length,
// dict .get/.items/.keys/.values; undefined when there is none.
Value builtin_member(const Value& obj, const std::string& name);
// false, true, none (and True/False/None), namespace, range, raise_exception,
// strftime_now (clock supplied by the caller).
using Clock = std::function<std::tm()>;
void install_globals(Env& env, Clock now);
// The string value's length in characters (code points), used by |length.
int64_t utf8_length(const std::string& s);
std::vector<std::string> utf8_chars(const std::string& s);

}  // namespace ptllm::jinja
