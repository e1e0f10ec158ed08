// Filters, tests, methods and globals. Where HF's renderer and Python's
// jinja2 differ, we follow HF for what it supports (our reference) and add
// Python's behaviour where HF has none (e.g. strip('\n') strips only '\n'
// here; HF ignores the argument).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include "serve/jinja_error.h"
#include "serve/jinja_eval.h"

namespace ptllm::jinja {

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    auto c = uint8_t(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    len = std::min(len, s.size() - i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

namespace {

// Full Unicode case mapping in the root locale ("é" -> "É", "ß" -> "SS"),
// what JavaScript's toUpperCase() and Python's str.upper() do.
std::string unicode_upper(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toUpper(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}
std::string unicode_lower(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}
bool word_char(char c) { return std::isalnum(uint8_t(c)) || c == '_'; }
// HF's title(): upper-case the first word character of every word.
std::string title_case(std::string s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (word_char(s[i]) && (i == 0 || !word_char(s[i - 1]))) s[i] = char(std::toupper(uint8_t(s[i])));
  return s;
}

// Python's strip family with an explicit character set.
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) b = s.find_first_not_of(chars);
  if (b == std::string::npos) return "";
  if (right) e = s.find_last_not_of(chars) + 1;
  return s.substr(b, e - b);
}
std::string strip_with(const std::string& s, const CallArgs& a, bool left, bool right) {
  const Value* chars = a.get(0, "chars");
  if (chars && chars->is_string()) return strip_chars(s, chars->as_string(), left, right);
  std::string r = left ? trim_start(s) : s;
  return right ? trim_end(r) : r;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (count == 0) return s;
  int64_t left = count < 0 ? INT64_MAX : count;
  std::string out;
  if (from.empty()) {  // insert between every character, as Python does
    for (const auto& ch : utf8_chars(s)) {
      if (left > 0) out += to, --left;
      out += ch;
    }
    if (left > 0) out += to;
    return out;
  }
  size_t i = 0;
  for (size_t j; left > 0 && (j = s.find(from, i)) != std::string::npos; --left) {
    out += s.substr(i, j - i) + to;
    i = j + from.size();
  }
  return out + s.substr(i);
}

Value split(const std::string& s, const CallArgs& a) {
  const Value* sep = a.get(0, "sep");
  const Value* maxv = a.get(1, "maxsplit");
  int64_t maxsplit = maxv && maxv->is_int() ? maxv->as_int() : -1;
  std::vector<Value> parts;
  if (!sep || sep->is_none() || sep->is_undefined()) {  // runs of whitespace
    std::string rest = trim_start(s);
    while (!rest.empty()) {
      if (maxsplit >= 0 && int64_t(parts.size()) >= maxsplit) {
        parts.push_back(Value::string(rest));
        break;
      }
      size_t i = 0, len = 0;
      while (i < rest.size() && !is_space_at(rest, i, &len)) ++i;
      parts.push_back(Value::string(rest.substr(0, i)));
      rest = trim_start(rest.substr(i));
    }
    return Value::array(std::move(parts));
  }
  if (!sep->is_string()) fail_here("split(): the separator must be a string");
  const std::string& d = sep->as_string();
  if (d.empty()) fail_here("split(): empty separator");
  size_t i = 0;
  for (size_t j; (maxsplit < 0 || int64_t(parts.size()) < maxsplit) && (j = s.find(d, i)) != std::string::npos;) {
    parts.push_back(Value::string(s.substr(i, j - i)));
    i = j + d.size();
  }
  parts.push_back(Value::string(s.substr(i)));
  return Value::array(std::move(parts));
}

bool affix_match(const std::string& s, const Value& pat, bool prefix) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail_here(std::string(prefix ? "startswith" : "endswith") + "() needs strings");
    const std::string& x = p.as_string();
    return x.size() <= s.size() && (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (pat.is_array()) {
    for (const auto& p : pat.items())
      if (one(p)) return true;
    return false;
  }
  return one(pat);
}

Value method(Function f) { return Value::function(std::move(f)); }

Value string_method(const std::string& s, const std::string& name) {
  if (name == "length") return Value::integer(utf8_length(s));
  if (name == "upper") return method([s](CallArgs&, Env&) { return Value::string(unicode_upper(s)); });
  if (name == "lower") return method([s](CallArgs&, Env&) { return Value::string(unicode_lower(s)); });
  if (name == "title") return method([s](CallArgs&, Env&) { return Value::string(title_case(s)); });
  if (name == "capitalize")
    return method([s](CallArgs&, Env&) {
      std::string r = s;
      if (!r.empty()) r[0] = char(std::toupper(uint8_t(r[0])));
      return Value::string(r);
    });
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r](CallArgs& a, Env&) { return Value::string(strip_with(s, a, l, r)); });
  }
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method([s, prefix, name](CallArgs& a, Env&) {
      if (a.positional.empty()) fail_here(name + "() needs an argument");
      return Value::boolean(affix_match(s, a.positional[0], prefix));
    });
  }
  if (name == "split") return method([s](CallArgs& a, Env&) { return split(s, a); });
  if (name == "replace")
    return method([s](CallArgs& a, Env&) {
      const Value *from = a.get(0, "old"), *to = a.get(1, "new"), *count = a.get(2, "count");
      if (!from || !to || !from->is_string() || !to->is_string()) fail_here("replace() needs two strings");
      if (count && !count->is_int() && !count->is_none()) fail_here("replace(): count must be an integer");
      return Value::string(replace_all(s, from->as_string(), to->as_string(), count && count->is_int() ? count->as_int() : -1));
    });
  if (name == "join")
    return method([s](CallArgs& a, Env&) {
      if (a.positional.empty() || !a.positional[0].is_array()) fail_here("join() needs a list");
      std::string out;
      for (size_t i = 0; i < a.positional[0].items().size(); ++i)
        out += (i ? s : "") + raw_string(a.positional[0].items()[i]);
      return Value::string(out);
    });
  return Value();
}

Value pairs(const Value& obj) {
  std::vector<Value> out;
  for (const auto& [k, v] : obj.attrs().entries) out.push_back(Value::array({Value::string(k), v}));
  return Value::array(std::move(out));
}

// -1 / 0 / 1; numbers with numbers, strings with strings (optionally
// case-folded); anything else is an error, as in the reference.
int compare(const Value& a, const Value& b, bool case_sensitive) {
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  if (a.is_string() && b.is_string()) {
    std::string x = case_sensitive ? a.as_string() : unicode_lower(a.as_string());
    std::string y = case_sensitive ? b.as_string() : unicode_lower(b.as_string());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if ((a.is_none() && b.is_none()) || (a.is_undefined() && b.is_undefined())) return 0;
  fail_here(std::string("cannot compare ") + a.type_name() + " with " + b.type_name());
}

bool flag(const CallArgs& a, size_t i, const std::string& name, bool dflt) {
  const Value* v = a.get(i, name);
  if (!v) return dflt;
  if (!v->is_bool()) fail_here(name + " must be true or false");
  return v->as_bool();
}

Value dictsort(const Value& obj, const CallArgs& a) {
  bool cs = flag(a, 0, "case_sensitive", false);
  const Value* by = a.get(1, "by");
  bool by_value = by && by->is_string() && by->as_string() == "value";
  if (by && !(by->is_string() && (by->as_string() == "key" || by_value))) fail_here("dictsort: by must be 'key' or 'value'");
  bool rev = flag(a, 2, "reverse", false);
  auto items = pairs(obj).items();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = compare(x.items()[by_value], y.items()[by_value], cs);
    return rev ? c > 0 : c < 0;
  });
  return Value::array(std::move(items));
}

Value object_method(const Value& obj, const std::string& name) {
  if (name == "get")
    return method([obj](CallArgs& a, Env&) {
      const Value* key = a.get(0, "key");
      if (!key || !key->is_string()) fail_here("get() needs a string key");
      if (const Value* v = obj.attrs().find(key->as_string())) return *v;
      const Value* d = a.get(1, "default");
      return d ? *d : Value::none();
    });
  if (name == "items") return method([obj](CallArgs&, Env&) { return pairs(obj); });
  if (name == "keys")
    return method([obj](CallArgs&, Env&) {
      std::vector<Value> out;
      for (const auto& [k, v] : obj.attrs().entries) out.push_back(Value::string(k));
      return Value::array(std::move(out));
    });
  if (name == "values")
    return method([obj](CallArgs&, Env&) {
      std::vector<Value> out;
      for (const auto& [k, v] : obj.attrs().entries) out.push_back(v);
      return Value::array(std::move(out));
    });
  if (name == "dictsort") return method([obj](CallArgs& a, Env&) { return dictsort(obj, a); });
  return Value();
}

// item.a.b (dotted path; integer parts index lists).
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t i = 0;
  for (;;) {
    size_t j = path.find('.', i);
    std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (v.has_attributes()) {
      const Value* f = v.attrs().find(part);
      v = f ? *f : Value();
    } else if (v.is_array() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      size_t k = std::stoul(part);
      v = k < v.items().size() ? v.items()[k] : Value();
    } else {
      return Value();
    }
    if (j == std::string::npos) return v;
    i = j + 1;
  }
}

int64_t parse_int_prefix(const std::string& s, bool* ok) {
  const char* p = s.c_str();
  char* end = nullptr;
  long long v = std::strtoll(p, &end, 10);
  *ok = end != p;
  return v;
}

const std::vector<Value>& need_list(const Value& v, const std::string& filter) {
  if (!v.is_array()) fail_here("filter '" + filter + "' needs a list, got " + v.type_name());
  return v.items();
}

Value select_items(const Value& operand, const std::string& name, const CallArgs& a) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "selectattr" || name == "select";
  const auto& items = need_list(operand, name);
  size_t t = by_attr ? 1 : 0;
  if (by_attr && (a.positional.empty() || !a.positional[0].is_string()))
    fail_here(name + " needs an attribute name");
  const Value* test = t < a.positional.size() ? &a.positional[t] : nullptr;
  if (test && !test->is_string()) fail_here(name + ": the test name must be a string");
  const Value* arg = t + 1 < a.positional.size() ? &a.positional[t + 1] : nullptr;
  std::vector<Value> out;
  for (const auto& item : items) {
    bool r = false;
    if (by_attr) {
      if (!item.has_attributes()) fail_here(name + " needs a list of dicts, found a " + item.type_name());
      const Value* v = item.attrs().find(a.positional[0].as_string());
      r = v && (test ? apply_test(test->as_string(), *v, arg) : v->truthy());
    } else {
      r = test ? apply_test(test->as_string(), item, arg) : item.truthy();
    }
    if (r == keep) out.push_back(item);
  }
  return Value::array(std::move(out));
}

Value tojson(const Value& operand, const CallArgs& a) {
  JsonOptions o;
  if (const Value* ind = a.get(0, "indent")) {
    if (!ind->is_int() && !ind->is_none()) fail_here("tojson: indent must be an integer");
    o.indent = ind->is_int() ? int(std::min<int64_t>(ind->as_int(), 64)) : -1;
  }
  o.ensure_ascii = flag(a, 99, "ensure_ascii", false);
  o.sort_keys = flag(a, 99, "sort_keys", false);
  if (const Value* sep = a.get(99, "separators"); sep && !sep->is_none()) {
    if (!sep->is_array() || sep->items().size() != 2 || !sep->items()[0].is_string() || !sep->items()[1].is_string())
      fail_here("tojson: separators must be a pair of strings");
    o.item_sep = sep->items()[0].as_string();
    o.key_sep = sep->items()[1].as_string();
  }
  return Value::string(to_json(operand, o));
}

Value indent(const std::string& s, const CallArgs& a) {
  const Value* w = a.get(0, "width");
  std::string pad = "    ";
  if (w && w->is_int()) pad = std::string(size_t(std::clamp<int64_t>(w->as_int(), 0, 1000)), ' ');
  else if (w && w->is_string()) pad = w->as_string();
  else if (w) fail_here("indent: width must be an integer or string");
  bool first = flag(a, 1, "first", false), blank = flag(a, 2, "blank", false);
  std::string out;
  size_t i = 0, line = 0;
  for (;; ++line) {
    size_t j = s.find('\n', i);
    std::string l = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if ((first || line > 0) && (blank || !l.empty())) out += pad;
    out += l;
    if (j == std::string::npos) break;
    out += '\n';
    i = j + 1;
  }
  return Value::string(out);
}

Value sort_list(const Value& operand, const CallArgs& a) {
  auto items = need_list(operand, "sort");
  bool rev = flag(a, 0, "reverse", false), cs = flag(a, 1, "case_sensitive", false);
  const Value* attr = a.get(2, "attribute");
  auto key = [&](const Value& v) {
    if (!attr || attr->is_none()) return v;
    return attribute_path(v, attr->is_int() ? std::to_string(attr->as_int()) : attr->as_string());
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = compare(key(x), key(y), cs);
    return rev ? c > 0 : c < 0;
  });
  return Value::array(std::move(items));
}

Value to_number(const Value& v, bool want_int, const CallArgs& a) {
  const Value* dflt = a.get(0, "default");
  Value fallback = dflt ? *dflt : want_int ? Value::integer(0) : Value::number(0);
  if (v.is_string()) {
    if (want_int) {
      bool ok = false;
      int64_t i = parse_int_prefix(v.as_string(), &ok);
      return ok ? Value::integer(i) : fallback;
    }
    char* end = nullptr;
    double d = std::strtod(v.as_string().c_str(), &end);
    return end != v.as_string().c_str() ? Value::number(d) : fallback;
  }
  if (v.is_bool()) return want_int ? Value::integer(v.as_bool()) : Value::number(v.as_bool());
  if (v.is_int()) return want_int ? v : Value::number(v.as_double());
  if (v.is_float()) return want_int ? Value::integer(int64_t(std::floor(v.as_double()))) : v;
  fail_here(std::string("filter '") + (want_int ? "int" : "float") + "' cannot convert a " + v.type_name());
}

Value named_filter(const std::string& name, const Value& v, const CallArgs& a, Env& env);

Value map_items(const Value& operand, const CallArgs& a, Env& env) {
  const auto& items = need_list(operand, "map");
  std::vector<Value> out;
  if (const Value* attr = a.get(99, "attribute")) {
    if (!attr->is_string()) fail_here("map: attribute must be a string");
    const Value* dflt = a.get(99, "default");
    for (const auto& item : items) {
      if (!item.has_attributes()) fail_here(std::string("map(attribute=...) needs dicts, found a ") + item.type_name());
      Value v = attribute_path(item, attr->as_string());
      out.push_back(v.is_undefined() && dflt ? *dflt : v);
    }
  } else {
    if (a.positional.empty() || !a.positional[0].is_string()) fail_here("map needs attribute=... or a filter name");
    CallArgs rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    for (const auto& item : items) out.push_back(named_filter(a.positional[0].as_string(), item, rest, env));
  }
  return Value::array(std::move(out));
}

Value named_filter(const std::string& name, const Value& v, const CallArgs& a, Env& env) {
  auto need_string = [&]() -> const std::string& {
    if (!v.is_string()) fail_here("filter '" + name + "' needs a string, got " + v.type_name());
    return v.as_string();
  };
  if (name == "safe") return v;
  if (name == "tojson") return tojson(v, a);
  if (name == "default" || name == "d") {
    const Value* d = a.get(0, "default_value");
    bool boolean = flag(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return d ? *d : Value::string("");
    return v;
  }
  if (name == "length" || name == "count") {
    if (v.is_array()) return Value::integer(int64_t(v.items().size()));
    if (v.is_string()) return Value::integer(utf8_length(v.as_string()));
    if (v.is_object()) return Value::integer(int64_t(v.attrs().entries.size()));
    fail_here("filter '" + name + "' needs a list, string or dict, got " + v.type_name());
  }
  if (name == "list") {
    if (v.is_string()) {
      std::vector<Value> out;
      for (auto& c : utf8_chars(v.as_string())) out.push_back(Value::string(c));
      return Value::array(std::move(out));
    }
    return Value::array(need_list(v, name));
  }
  if (name == "first" || name == "last") {
    const auto& items = need_list(v, name);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = utf8_chars(v.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value::string(out);
    }
    auto items = need_list(v, name);
    std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
  }
  if (name == "sort") return sort_list(v, a);
  if (name == "unique") {
    std::vector<Value> out;
    for (const auto& item : need_list(v, name)) {
      bool seen = false;
      for (const auto& o : out) seen = seen || strict_equal(o, item);
      if (!seen) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    if (sep && !sep->is_string()) fail_here("join: the separator must be a string");
    const Value* attr = a.get(1, "attribute");
    std::string d = sep ? sep->as_string() : "", out;
    if (v.is_string()) {
      auto cs = utf8_chars(v.as_string());
      for (size_t i = 0; i < cs.size(); ++i) out += (i ? d : "") + cs[i];
      return Value::string(out);
    }
    const auto& items = need_list(v, name);
    for (size_t i = 0; i < items.size(); ++i)
      out += (i ? d : "") + raw_string(attr && attr->is_string() ? attribute_path(items[i], attr->as_string()) : items[i]);
    return Value::string(out);
  }
  if (name == "string") {
    if (v.is_undefined() || v.is_none() || v.is_function()) fail_here(std::string("filter 'string' cannot convert a ") + v.type_name());
    return Value::string(v.to_output());
  }
  if (name == "upper") return Value::string(unicode_upper(need_string()));
  if (name == "lower") return Value::string(unicode_lower(need_string()));
  if (name == "title") return Value::string(title_case(need_string()));
  if (name == "capitalize" || name == "replace") {
    CallArgs copy = a;
    return string_method(need_string(), name).fn()(copy, env);
  }
  if (name == "trim") return Value::string(strip_with(need_string(), a, true, true));
  if (name == "indent") return indent(need_string(), a);
  if (name == "int" || name == "float") return to_number(v, name == "int", a);
  if (name == "abs") {
    if (v.is_int()) return Value::integer(std::llabs(v.as_int()));
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    fail_here(std::string("filter 'abs' needs a number, got ") + v.type_name());
  }
  if (name == "bool") return Value::boolean(v.truthy());
  if (name == "items") {
    if (!v.has_attributes()) fail_here(std::string("filter 'items' needs a dict, got ") + v.type_name());
    return pairs(v);
  }
  if (name == "dictsort") {
    if (!v.has_attributes()) fail_here(std::string("filter 'dictsort' needs a dict, got ") + v.type_name());
    return dictsort(v, a);
  }
  const bool selects = name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject";
  // jinja2 selects from / maps over none or undefined as an empty list
  // (functionary's `tools | selectattr(...)` with no tools); HF fails.
  if ((selects || name == "map") && (v.is_none() || v.is_undefined())) return Value::array();
  if (selects) return select_items(v, name, a);
  if (name == "map") return map_items(v, a, env);
  fail_here("unknown filter '" + name + "'");
}

}  // namespace

Value apply_filter(Interpreter& in, const Value& operand, const Node& filter, Env& env) {
  if (filter.kind == NodeKind::Ident) return named_filter(filter.text, operand, CallArgs{}, env);
  // filter(args): kids[0] is the name.
  CallArgs args = in.eval_args(filter, 1, env);
  return named_filter(filter.kids[0]->text, operand, args, env);
}

bool apply_test(const std::string& name, const Value& v, const Value* arg) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "iterable") return v.is_array() || v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "callable") return v.is_function();
  if (name == "lower") return v.is_string() && v.as_string() == unicode_lower(v.as_string());
  if (name == "upper") return v.is_string() && v.as_string() == unicode_upper(v.as_string());
  if (name == "odd" || name == "even") {
    if (!v.is_int()) fail_here("test '" + name + "' needs an integer, got " + v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq" || name == "==") return strict_equal(v, arg ? *arg : Value());
  if (name == "ne" || name == "!=") return !strict_equal(v, arg ? *arg : Value());
  fail_here("unknown test '" + name + "'");
}

Value builtin_member(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj.as_string(), name);
  if (obj.is_array()) return name == "length" ? Value::integer(int64_t(obj.items().size())) : Value();
  if (obj.is_object()) return object_method(obj, name);
  return Value();
}

void install_globals(Env& env, Clock now) {
  env.set("true", Value::boolean(true));
  env.set("false", Value::boolean(false));
  env.set("none", Value::none());
  env.set("True", Value::boolean(true));
  env.set("False", Value::boolean(false));
  env.set("None", Value::none());
  env.set("raise_exception", method([](CallArgs& a, Env&) -> Value {
            std::string msg = a.positional.empty() ? "" : a.positional[0].to_output();
            throw TemplateError{msg, kNoPos, true};
          }));
  env.set("namespace", method([](CallArgs& a, Env&) {
            Value ns = Value::namespace_();
            if (a.positional.size() > 1) fail_here("namespace() takes at most one positional argument");
            if (!a.positional.empty()) {
              if (!a.positional[0].is_object()) fail_here("namespace() needs a dict or keyword arguments");
              for (const auto& [k, v] : a.positional[0].attrs().entries) ns.attrs().set(k, v);
            }
            for (const auto& [k, v] : a.keyword) ns.attrs().set(k, v);
            return ns;
          }));
  env.set("range", method([](CallArgs& a, Env&) {
            for (const auto& v : a.positional)
              if (!v.is_int()) fail_here("range() needs integers");
            if (a.positional.empty() || a.positional.size() > 3) fail_here("range() takes 1 to 3 integers");
            int64_t start = 0, stop = a.positional[0].as_int(), step = 1;
            if (a.positional.size() >= 2) start = stop, stop = a.positional[1].as_int();
            if (a.positional.size() == 3) step = a.positional[2].as_int();
            if (step == 0) fail_here("range() step must not be zero");
            std::vector<Value> out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
              if (out.size() >= 10000000) fail_here("range() is too long");
              out.push_back(Value::integer(i));
            }
            return Value::array(std::move(out));
          }));
  env.set("strftime_now", method([now](CallArgs& a, Env&) {
            if (a.positional.empty() || !a.positional[0].is_string()) fail_here("strftime_now() needs a format string");
            std::tm t = now();
            char buf[512];
            size_t n = std::strftime(buf, sizeof buf, a.positional[0].as_string().c_str(), &t);
            return Value::string(std::string(buf, n));
          }));
}

}  // namespace ptllm::jinja
