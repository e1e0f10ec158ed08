#include "serve/jinja_eval.h"

#include <cmath>

#include "serve/jinja_error.h"

namespace ptllm::jinja {
namespace {

struct BreakSignal {};
struct ContinueSignal {};

// Deep enough for any real template; stops runaway recursive macros before
// they exhaust the C++ stack.
constexpr int kMaxDepth = 400;

struct DepthGuard {
  explicit DepthGuard(int& d, size_t pos) : d(d) {
    if (++d > kMaxDepth) {
      --d;
      fail_at(pos, "template nests or recurses too deeply (over " + std::to_string(kMaxDepth) + " levels)");
    }
  }
  ~DepthGuard() { --d; }
  int& d;
};

bool mentions(const Block& b, const std::string& name);
bool mentions(const Node* n, const std::string& name) {
  if (!n) return false;
  if (n->kind == NodeKind::Ident && n->text == name) return true;
  for (const auto& k : n->kids)
    if (mentions(k.get(), name)) return true;
  return mentions(n->body, name) || mentions(n->orelse, name);
}
bool mentions(const Block& b, const std::string& name) {
  for (const auto& n : b)
    if (mentions(n.get(), name)) return true;
  return false;
}

// Whether `v` holds `target` (a namespace) anywhere inside it. Namespaces
// are the only mutable containers, so refusing `ns.x = <something holding
// ns>` is enough to keep values acyclic (reference counts then free them).
bool holds(const Value& v, const void* target, int depth = 0) {
  if (v.identity() == target) return true;
  if (depth > 256) fail_here("value nests too deeply (over 256 levels)");
  if (v.is_array()) {
    for (const auto& e : v.items())
      if (holds(e, target, depth + 1)) return true;
  } else if (v.has_attributes()) {
    for (const auto& [k, e] : v.attrs().entries)
      if (holds(e, target, depth + 1)) return true;
  }
  return false;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

std::string Interpreter::render(const Block& block, Env& env) {
  std::string out;
  for (const auto& n : block) {
    Value v = eval(*n, env);
    if (!v.is_none() && !v.is_undefined()) out += v.to_output();
  }
  return out;
}

Value Interpreter::eval(const Node& n, Env& env) {
  DepthGuard guard(depth_, n.pos);
  try {
    switch (n.kind) {
      case NodeKind::Text: return Value::string(n.text);
      case NodeKind::Comment:
      case NodeKind::Macro:
        if (n.kind == NodeKind::Macro) env.set(n.text, make_macro(n));
        return Value::none();
      case NodeKind::If:
        return Value::string(render(eval(*n.kids[0], env).truthy() ? n.body : n.orelse, env));
      case NodeKind::For: return eval_for(n, env);
      case NodeKind::Set: eval_set(n, env); return Value::none();
      case NodeKind::Break: throw BreakSignal{};
      case NodeKind::Continue: throw ContinueSignal{};
      case NodeKind::CallBlock: return eval_call_block(n, env);
      case NodeKind::FilterBlock: return apply_filter(*this, Value::string(render(n.body, env)), *n.kids[0], env);
      default: return eval_expr(n, env);
    }
  } catch (TemplateError& e) {
    if (e.pos == kNoPos) e.pos = n.pos;
    throw;
  }
}

Value Interpreter::eval_expr(const Node& n, Env& env) {
  switch (n.kind) {
    case NodeKind::Int: return Value::integer(n.ival);
    case NodeKind::Float: return Value::number(n.fval);
    case NodeKind::Str: return Value::string(n.text);
    case NodeKind::Ident: return env.lookup(n.text);
    case NodeKind::ArrayLit:
    case NodeKind::TupleLit: {
      std::vector<Value> items;
      for (const auto& k : n.kids) items.push_back(eval(*k, env));
      return Value::array(std::move(items));
    }
    case NodeKind::DictLit: {
      Value o = Value::object();
      for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
        Value key = eval(*n.kids[i], env);
        if (!key.is_string()) fail_at(n.kids[i]->pos, std::string("dict keys must be strings, got ") + key.type_name());
        o.attrs().set(key.as_string(), eval(*n.kids[i + 1], env));
      }
      return o;
    }
    case NodeKind::Member: return eval_member(n, env);
    case NodeKind::Call: {
      CallArgs args = eval_args(n, 1, env);
      Value fn = eval(*n.kids[0], env);
      if (!fn.is_function())
        fail_at(n.pos, std::string("cannot call a value of type ") + fn.type_name() +
                           (n.kids[0]->kind == NodeKind::Ident ? " ('" + n.kids[0]->text + "')" : ""));
      return fn.fn()(args, env);
    }
    case NodeKind::Unary: return eval_unary(n, env);
    case NodeKind::Binary: return eval_binary(n, env);
    case NodeKind::Filter: return apply_filter(*this, eval(*n.kids[0], env), *n.kids[1], env);
    case NodeKind::Test: {
      bool r = apply_test(n.text, eval(*n.kids[0], env));
      return Value::boolean(n.flag ? !r : r);
    }
    case NodeKind::Select:
      return eval(*n.kids[1], env).truthy() ? eval(*n.kids[0], env) : Value();
    case NodeKind::Ternary:
      return eval(*n.kids[eval(*n.kids[0], env).truthy() ? 1 : 2], env);
    case NodeKind::KwArg: fail_at(n.pos, "keyword argument outside a call");
    case NodeKind::Slice: fail_at(n.pos, "slice outside a subscript");
    default: fail_at(n.pos, "statement used as an expression");
  }
}

CallArgs Interpreter::eval_args(const Node& call, size_t first, Env& env) {
  CallArgs a;
  for (size_t i = first; i < call.kids.size(); ++i) {
    const Node& k = *call.kids[i];
    if (k.kind == NodeKind::KwArg) {
      for (const auto& [name, v] : a.keyword)
        if (name == k.text) fail_at(k.pos, "keyword argument '" + k.text + "' given twice");
      a.keyword.emplace_back(k.text, eval(*k.kids[0], env));
    } else {
      a.positional.push_back(eval(k, env));
    }
  }
  return a;
}

Value Interpreter::eval_member(const Node& n, Env& env) {
  Value obj = eval(*n.kids[0], env);
  const Node& p = *n.kids[1];
  if (n.flag && p.kind == NodeKind::Slice) return eval_slice(obj, p, env);
  Value key = !n.flag ? (p.kind == NodeKind::Int ? Value::integer(p.ival) : Value::string(p.text)) : eval(p, env);
  if (obj.has_attributes()) {
    if (!key.is_string()) fail_at(n.pos, std::string("dict keys are strings, got ") + key.type_name());
    if (const Value* v = obj.attrs().find(key.as_string())) return *v;
    return obj.is_object() ? builtin_member(obj, key.as_string()) : Value();
  }
  if (obj.is_array() || obj.is_string()) {
    if (key.is_int()) {
      if (obj.is_array()) {
        auto& items = obj.items();
        int64_t i = key.as_int() < 0 ? key.as_int() + int64_t(items.size()) : key.as_int();
        return i >= 0 && i < int64_t(items.size()) ? items[size_t(i)] : Value();
      }
      auto chars = utf8_chars(obj.as_string());
      int64_t i = key.as_int() < 0 ? key.as_int() + int64_t(chars.size()) : key.as_int();
      return i >= 0 && i < int64_t(chars.size()) ? Value::string(chars[size_t(i)]) : Value();
    }
    if (key.is_string()) return builtin_member(obj, key.as_string());
    fail_at(n.pos, std::string("cannot index a ") + obj.type_name() + " with a " + key.type_name());
  }
  if (!key.is_string()) fail_at(n.pos, std::string("cannot index a ") + obj.type_name() + " with a " + key.type_name());
  return builtin_member(obj, key.as_string());
}

Value Interpreter::eval_slice(const Value& obj, const Node& slice, Env& env) {
  if (!obj.is_array() && !obj.is_string())
    fail_at(slice.pos, std::string("only lists and strings can be sliced, got ") + obj.type_name());
  int64_t part[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  for (int k = 0; k < 3; ++k) {
    if (!slice.kids[size_t(k)]) continue;
    Value v = eval(*slice.kids[size_t(k)], env);
    if (v.is_undefined()) continue;
    if (!v.is_int()) fail_at(slice.pos, std::string("slice bounds must be integers, got ") + v.type_name());
    part[k] = v.as_int();
    given[k] = true;
  }
  if (part[2] == 0) fail_at(slice.pos, "slice step cannot be zero");
  std::vector<std::string> chars;
  if (obj.is_string()) chars = utf8_chars(obj.as_string());
  const int64_t len = obj.is_array() ? int64_t(obj.items().size()) : int64_t(chars.size());
  const int64_t step = part[2];
  int64_t start, stop;
  if (step > 0) {
    start = !given[0] ? 0 : part[0] < 0 ? std::max<int64_t>(len + part[0], 0) : std::min(part[0], len);
    stop = !given[1] ? len : part[1] < 0 ? std::max<int64_t>(len + part[1], 0) : std::min(part[1], len);
  } else {
    start = !given[0] ? len - 1 : part[0] < 0 ? std::max<int64_t>(len + part[0], -1) : std::min(part[0], len - 1);
    stop = !given[1] ? -1 : part[1] < -1 ? std::max<int64_t>(len + part[1], -1) : std::min(part[1], len - 1);
  }
  std::vector<Value> items;
  std::string text;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_array()) items.push_back(obj.items()[size_t(i)]);
    else text += chars[size_t(i)];
  }
  return obj.is_array() ? Value::array(std::move(items)) : Value::string(std::move(text));
}

Value Interpreter::eval_unary(const Node& n, Env& env) {
  Value v = eval(*n.kids[0], env);
  if (n.text == "not") return Value::boolean(!v.truthy());
  int sign = n.text == "-" ? -1 : 1;
  if (v.is_float()) return Value::number(sign * v.as_double());
  if (v.is_int()) return Value::integer(sign * v.as_int());
  if (v.is_bool()) return Value::integer(sign * int64_t(v.as_bool()));
  fail_at(n.pos, "unary '" + n.text + "' needs a number, got " + v.type_name());
}

Value Interpreter::eval_binary(const Node& n, Env& env) {
  const std::string& op = n.text;
  Value l = eval(*n.kids[0], env);
  if (op == "and") return l.truthy() ? eval(*n.kids[1], env) : l;
  if (op == "or") return l.truthy() ? l : eval(*n.kids[1], env);
  Value r = eval(*n.kids[1], env);
  if (op == "==") return Value::boolean(loose_equal(l, r));
  if (op == "!=") return Value::boolean(!loose_equal(l, r));
  const bool is_in = op == "in" || op == "not in";
  if (l.is_undefined() || r.is_undefined()) {
    if (r.is_undefined() && is_in) return Value::boolean(op == "not in");
    fail_at(n.pos, "cannot apply '" + op + "' to an undefined value");
  }
  if (l.is_none() || r.is_none()) fail_at(n.pos, "cannot apply '" + op + "' to none");
  if (op == "~") return Value::string(raw_string(l) + raw_string(r));
  if (l.is_number() && r.is_number()) {
    const bool fl = l.is_float() || r.is_float();
    const double a = l.as_double(), b = r.as_double();
    if (op == "+") return fl ? Value::number(a + b) : Value::integer(l.as_int() + r.as_int());
    if (op == "-") return fl ? Value::number(a - b) : Value::integer(l.as_int() - r.as_int());
    if (op == "*") return fl ? Value::number(a * b) : Value::integer(l.as_int() * r.as_int());
    if (op == "/" || op == "//" || op == "%") {
      if (b == 0) fail_at(n.pos, "division by zero");
      if (op == "/") return Value::number(a / b);
      if (op == "//") return fl ? Value::number(std::floor(a / b)) : Value::integer(floor_div(l.as_int(), r.as_int()));
      return fl ? Value::number(std::fmod(a, b)) : Value::integer(l.as_int() % r.as_int());
    }
    if (op == "**") {
      double p = std::pow(a, b);
      if (!std::isfinite(p)) fail_at(n.pos, "'**' result is not a finite number");
      return fl || b < 0 ? Value::number(p) : Value::integer(int64_t(p));
    }
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == "<=") return Value::boolean(a <= b);
    if (op == ">=") return Value::boolean(a >= b);
  }
  if (l.is_array() && r.is_array() && op == "+") {
    std::vector<Value> items = l.items();
    items.insert(items.end(), r.items().begin(), r.items().end());
    return Value::array(std::move(items));
  }
  if (r.is_array() && is_in) {
    bool found = false;
    for (const auto& e : r.items()) found = found || strict_equal(e, l);
    return Value::boolean(found == (op == "in"));
  }
  if ((l.is_string() || r.is_string()) && op == "+") {
    if (l.has_attributes() || r.has_attributes())
      fail_at(n.pos, std::string("cannot concatenate ") + l.type_name() + " and " + r.type_name() + " with '+'");
    return Value::string(raw_string(l) + raw_string(r));
  }
  if (l.is_string() && r.is_string()) {
    const std::string &a = l.as_string(), &b = r.as_string();
    if (is_in) return Value::boolean((b.find(a) != std::string::npos) == (op == "in"));
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == "<=") return Value::boolean(a <= b);
    if (op == ">=") return Value::boolean(a >= b);
  }
  if (l.is_string() && r.is_object() && is_in)
    return Value::boolean((r.attrs().find(l.as_string()) != nullptr) == (op == "in"));
  // Python's string repetition ("  " * depth), which the HF renderer lacks.
  if (op == "*" && l.is_string() && r.is_int()) {
    std::string s;
    for (int64_t i = 0; i < r.as_int() && i < 1000000; ++i) s += l.as_string();
    return Value::string(std::move(s));
  }
  fail_at(n.pos, "cannot apply '" + op + "' to " + l.type_name() + " and " + r.type_name());
}

void Interpreter::eval_set(const Node& n, Env& env) {
  Value rhs = n.kids.size() > 1 ? eval(*n.kids[1], env) : Value::string(render(n.body, env));
  const Node& target = *n.kids[0];
  if (target.kind == NodeKind::Ident) {
    env.set(target.text, std::move(rhs));
  } else if (target.kind == NodeKind::TupleLit) {
    if (!rhs.is_array()) fail_at(n.pos, std::string("cannot unpack a ") + rhs.type_name() + " in set");
    if (rhs.items().size() != target.kids.size())
      fail_at(n.pos, "set unpacks " + std::to_string(target.kids.size()) + " names from " +
                         std::to_string(rhs.items().size()) + " values");
    for (size_t i = 0; i < target.kids.size(); ++i) {
      if (target.kids[i]->kind != NodeKind::Ident) fail_at(target.kids[i]->pos, "set can only unpack into names");
      env.set(target.kids[i]->text, rhs.items()[i]);
    }
  } else if (target.kind == NodeKind::Member && !target.flag) {
    Value obj = eval(*target.kids[0], env);
    if (!obj.is_namespace()) fail_at(n.pos, "set x.attr needs x to be a namespace(), got a " + std::string(obj.type_name()));
    // Functions (bound methods, macros) could hide a reference back to it.
    if (rhs.is_function()) fail_at(n.pos, "cannot store a function in a namespace");
    if (holds(rhs, obj.identity())) fail_at(n.pos, "cannot store a namespace inside itself");
    obj.attrs().set(target.kids[1]->text, std::move(rhs));
  } else {
    fail_at(n.pos, "set needs a name, a tuple of names or namespace.attr on the left");
  }
}

Value Interpreter::eval_for(const Node& n, Env& env) {
  Env scope(&env);
  const Node& target = *n.kids[0];
  const Node* iter_node = n.kids[1].get();
  const Node* cond = nullptr;
  if (iter_node->kind == NodeKind::Select) {  // for x in xs if cond
    cond = iter_node->kids[1].get();
    iter_node = iter_node->kids[0].get();
  }
  Value iterable = eval(*iter_node, scope);
  std::vector<Value> all;
  if (iterable.is_array()) {
    all = iterable.items();
  } else if (iterable.is_object()) {
    for (const auto& [k, v] : iterable.attrs().entries) all.push_back(Value::string(k));
  } else if (!iterable.is_undefined()) {  // undefined iterates as empty, as in jinja2 (HF fails)
    fail_at(iter_node->pos, std::string("for loop needs a list or dict, got ") + iterable.type_name());
  }
  auto bind = [&](Env& e, const Value& item) {
    if (target.kind == NodeKind::Ident) return e.set(target.text, item);
    if (!item.is_array()) fail_at(target.pos, std::string("cannot unpack a ") + item.type_name() + " in for");
    if (item.items().size() != target.kids.size())
      fail_at(target.pos, "for unpacks " + std::to_string(target.kids.size()) + " names from " +
                              std::to_string(item.items().size()) + " values");
    for (size_t j = 0; j < target.kids.size(); ++j) {
      if (target.kids[j]->kind != NodeKind::Ident) fail_at(target.kids[j]->pos, "for can only unpack into names");
      e.set(target.kids[j]->text, item.items()[j]);
    }
  };
  std::vector<Value> items;
  for (const auto& item : all) {
    if (cond) {
      Env test_scope(&scope);
      bind(test_scope, item);
      if (!eval(*cond, test_scope).truthy()) continue;
    }
    items.push_back(item);
  }
  std::string out;
  bool ran = false;
  const int64_t len = int64_t(items.size());
  for (int64_t i = 0; i < len; ++i) {
    Value loop = Value::object();
    auto& l = loop.attrs();
    l.set("index", Value::integer(i + 1));
    l.set("index0", Value::integer(i));
    l.set("revindex", Value::integer(len - i));
    l.set("revindex0", Value::integer(len - i - 1));
    l.set("first", Value::boolean(i == 0));
    l.set("last", Value::boolean(i == len - 1));
    l.set("length", Value::integer(len));
    l.set("previtem", i > 0 ? items[size_t(i - 1)] : Value());
    l.set("nextitem", i + 1 < len ? items[size_t(i + 1)] : Value());
    scope.set("loop", loop);
    bind(scope, items[size_t(i)]);
    try {
      out += render(n.body, scope);
    } catch (const ContinueSignal&) {
      continue;
    } catch (const BreakSignal&) {
      break;
    }
    ran = true;
  }
  if (!ran) out += render(n.orelse, scope);
  return Value::string(std::move(out));
}

void Interpreter::bind_params(const std::string& name, const std::vector<const Node*>& params, bool takes_kwargs,
                              bool takes_varargs, CallArgs& args, Env& scope) {
  std::vector<std::pair<std::string, Value>> kw = args.keyword;
  std::vector<const Node*> defaults;
  for (size_t i = 0; i < params.size(); ++i) {
    const Node& p = *params[i];
    Value v;
    bool have = false;
    if (i < args.positional.size()) {
      v = args.positional[i];
      have = true;
    } else {
      for (auto it = kw.begin(); it != kw.end(); ++it)
        if (it->first == p.text) {
          v = it->second;
          kw.erase(it);
          have = true;
          break;
        }
    }
    if (!have && p.kind == NodeKind::KwArg) defaults.push_back(&p);
    scope.set(p.text, v);
  }
  if (takes_kwargs) {
    Value o = Value::object();
    for (auto& [k, v] : kw) o.attrs().set(k, v);
    scope.set("kwargs", o);
  } else if (!kw.empty()) {
    fail_here("macro '" + name + "' takes no keyword argument '" + kw.front().first + "'");
  }
  if (takes_varargs) {
    std::vector<Value> rest;
    for (size_t i = params.size(); i < args.positional.size(); ++i) rest.push_back(args.positional[i]);
    scope.set("varargs", Value::array(std::move(rest)));
  } else if (args.positional.size() > params.size()) {
    fail_here("macro '" + name + "' takes at most " + std::to_string(params.size()) + " argument(s)");
  }
  for (const Node* d : defaults) scope.set(d->text, eval(*d->kids[0], scope));
}

Value Interpreter::make_macro(const Node& n) {
  const Node* node = &n;
  bool kwargs = mentions(n.body, "kwargs"), varargs = mentions(n.body, "varargs");
  return Value::function([this, node, kwargs, varargs](CallArgs& args, Env& caller) {
    Env scope(&caller);
    std::vector<const Node*> params;
    for (const auto& k : node->kids) params.push_back(k.get());
    bind_params(node->text, params, kwargs, varargs, args, scope);
    return Value::string(render(node->body, scope));
  });
}

Value Interpreter::eval_call_block(const Node& n, Env& env) {
  const Node& call = *n.kids[0];
  const Node* block = &n;
  bool kwargs = mentions(n.body, "kwargs"), varargs = mentions(n.body, "varargs");
  Value caller = Value::function([this, block, &env, kwargs, varargs](CallArgs& args, Env&) {
    Env scope(&env);
    std::vector<const Node*> params;  // caller(...) parameters: kids[1..]
    for (size_t i = 1; i < block->kids.size(); ++i) params.push_back(block->kids[i].get());
    bind_params("caller", params, kwargs, varargs, args, scope);
    return Value::string(render(block->body, scope));
  });
  CallArgs args = eval_args(call, 1, env);
  Value fn = eval(*call.kids[0], env);
  if (!fn.is_function()) fail_at(call.pos, "call block needs a macro, got a " + std::string(fn.type_name()));
  Env scope(&env);
  scope.set("caller", caller);
  return fn.fn()(args, scope);
}

}  // namespace ptllm::jinja
