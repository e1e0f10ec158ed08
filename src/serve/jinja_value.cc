#include "serve/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "serve/jinja_error.h"

namespace ptllm::jinja {

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Int;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::Float;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::Array;
  v.arr_ = std::make_shared<ArrayData>();
  v.arr_->items = std::move(items);
  return v;
}
Value Value::object() {
  Value v;
  v.kind_ = Kind::Object;
  v.obj_ = std::make_shared<ObjectData>();
  return v;
}
Value Value::namespace_() {
  Value v = object();
  v.kind_ = Kind::Namespace;
  return v;
}
Value Value::function(Function fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 512) fail_here("template variables nest too deeply (over 512 levels)");
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return integer(int64_t(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float: {
      // The reference receives JSON through JavaScript, where 2.0 is the
      // integer 2: integral floats become integers so both print "2".
      double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return integer(int64_t(d));
      return number(d);
    }
    case nlohmann::json::value_t::string: return string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return array(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value o = object();
      for (const auto& [k, e] : j.items()) o.attrs().set(k, from_json(e, depth + 1));
      return o;
    }
    default: return Value();  // binary / discarded: not produced by JSON text
  }
}

const std::string& Value::empty_string() {
  static const std::string empty;
  return empty;
}

std::vector<Value>& Value::items() const { return arr_->items; }
ObjectData& Value::attrs() const { return *obj_; }

const void* Value::identity() const {
  if (arr_) return arr_.get();
  if (obj_) return obj_.get();
  if (fn_) return fn_.get();
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0 && !std::isnan(f_);
    case Kind::String: return !as_string().empty();
    case Kind::Array: return !arr_->items.empty();
    case Kind::Object: return !obj_->entries.empty();
    case Kind::Namespace:
    case Kind::Function: return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "boolean";
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::Array: return "list";
    case Kind::Object: return "dict";
    case Kind::Namespace: return "namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

std::string js_number(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x == 0) return "0";
  // Shortest round-trip digits and decimal exponent, then JavaScript's layout.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp10 = std::stoi(sci.substr(e + 1));  // x = d.ddd * 10^exp10
  int k = int(digits.size());
  int n = exp10 + 1;  // position of the decimal point
  std::string out;
  if (k <= n && n <= 21) {
    out = digits + std::string(size_t(n - k), '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, size_t(n)) + "." + digits.substr(size_t(n));
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(size_t(-n), '0') + digits;
  } else {
    std::string mant = k == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
    int ee = n - 1;
    out = mant + "e" + (ee < 0 ? "-" : "+") + std::to_string(std::abs(ee));
  }
  return neg ? "-" + out : out;
}

std::string Value::to_output() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return "";
    case Kind::Bool: return b_ ? "true" : "false";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float:
      if (f_ == 0 && std::signbit(f_)) return "-0.0";
      if (std::isfinite(f_) && f_ == std::floor(f_) && std::fabs(f_) < 1e21) return js_number(f_) + ".0";
      return js_number(f_);
    case Kind::String: return as_string();
    case Kind::Array:
    case Kind::Object:
    case Kind::Namespace: {
      JsonOptions o;
      o.undefined_as_null = false;
      return to_json(*this, o);
    }
    case Kind::Function: return "[function]";
  }
  return "";
}

std::string raw_string(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Float: return js_number(v.as_double());
    case Value::Kind::Array: {
      std::string s;
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) s += ',';
        s += v.items()[i].to_output();
      }
      return s;
    }
    case Value::Kind::Object:
    case Value::Kind::Namespace: return "[object Map]";
    default: return v.to_output();
  }
}

const Value* ObjectData::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void ObjectData::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t i, const std::string& name) const {
  if (i < positional.size()) return &positional[i];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

// Appends code point cp as UTF-8 (jinja_value.h).
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

namespace {


// Decodes one UTF-8 sequence at s[i] (advancing i); malformed bytes decode
// as themselves so no input is rejected here.
uint32_t next_cp(const std::string& s, size_t& i) {
  auto c = uint8_t(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + size_t(len) > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
  i += size_t(len);
  return cp;
}

void hex4(std::string& out, uint32_t u) {
  char b[8];
  std::snprintf(b, sizeof b, "\\u%04x", unsigned(u));
  out += b;
}

}  // namespace

std::string json_quote(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    auto c = uint8_t(s[i]);
    if (c >= 0x80) {
      uint32_t cp = next_cp(s, i);
      if (!ensure_ascii) {
        append_utf8(out, cp);
      } else if (cp >= 0x10000) {  // UTF-16 surrogate pair, as JavaScript sees it
        cp -= 0x10000;
        hex4(out, 0xD800 + (cp >> 10));
        hex4(out, 0xDC00 + (cp & 0x3FF));
      } else {
        hex4(out, cp);
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) hex4(out, c);
        else if (c == 0x7f && ensure_ascii) hex4(out, c);
        else out += char(c);
    }
  }
  return out + "\"";
}

std::string to_json(const Value& v, const JsonOptions& opt, int depth) {
  // A namespace can hold itself ({% set ns.me = ns %}): stop instead of
  // recursing until the stack overflows.
  if (depth > 256) fail_here("value nests too deeply to print (over 256 levels, or it contains itself)");
  switch (v.kind()) {
    case Value::Kind::Undefined: return opt.undefined_as_null ? "null" : "undefined";
    case Value::Kind::None: return "null";
    case Value::Kind::Bool: return v.as_bool() ? "true" : "false";
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return std::isfinite(v.as_double()) ? js_number(v.as_double()) : "null";
    case Value::Kind::String: return json_quote(v.as_string(), opt.ensure_ascii);
    case Value::Kind::Function: fail_here("tojson: cannot convert a function to JSON");
    default: break;
  }
  const bool ind = opt.indent > 0;
  std::string item_sep = !opt.item_sep.empty() ? opt.item_sep : ind ? "," : ", ";
  std::string key_sep = !opt.key_sep.empty() ? opt.key_sep : ": ";
  std::string unit = ind ? std::string(size_t(opt.indent), ' ') : "";
  std::string base = "\n";
  for (int d = 0; d < depth; ++d) base += unit;
  std::string child = base + unit;
  std::vector<std::string> parts;
  if (v.is_array()) {
    for (const auto& e : v.items()) parts.push_back(to_json(e, opt, depth + 1));
  } else {
    auto entries = v.attrs().entries;
    if (opt.sort_keys)
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [k, e] : entries)
      parts.push_back((ind ? child : "") + json_quote(k, opt.ensure_ascii) + key_sep + to_json(e, opt, depth + 1));
  }
  std::string out = v.is_array() ? "[" : "{";
  if (v.is_array() && ind && !parts.empty()) out += child;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += v.is_array() && ind ? item_sep + child : item_sep;
    out += parts[i];
  }
  if (ind && !parts.empty()) out += base;
  return out + (v.is_array() ? "]" : "}");
}

bool strict_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::Bool: return a.as_bool() == b.as_bool();
    case Value::Kind::String: return a.as_string() == b.as_string();
    default: return a.identity() == b.identity();
  }
}

bool loose_equal(const Value& a, const Value& b) {
  auto nullish = [](const Value& v) { return v.is_none() || v.is_undefined(); };
  if (nullish(a) || nullish(b)) return nullish(a) && nullish(b);
  auto numeric = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (numeric(a) && numeric(b)) return a.as_double() == b.as_double();
  return strict_equal(a, b);
}

}  // namespace ptllm::jinja
