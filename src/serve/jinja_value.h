// The value type of the Jinja engine: what templates compute with.
//
// Semantics follow @huggingface/jinja (the renderer transformers.js and the
// Hub use, and the reference our tests compare against), which in turn
// follows Python's jinja2 for everything chat templates rely on: undefined is
// falsy and prints as nothing, attribute of undefined is undefined, arrays and
// objects are shared by reference (a namespace() set inside a loop is seen
// outside it), objects keep insertion order (tojson prints keys as given).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ptllm::jinja {

class Value;
struct ArrayData;
struct ObjectData;
struct CallArgs;
struct Env;
using Function = std::function<Value(CallArgs&, Env&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Namespace, Function };

  Value() = default;  // undefined
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value array(std::vector<Value> items = {});
  static Value object();
  static Value namespace_();
  static Value function(Function fn);
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  // Objects and namespaces both hold attributes (ns.x, obj.x, obj['x']).
  bool has_attributes() const { return kind_ == Kind::Object || kind_ == Kind::Namespace; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::Int ? double(i_) : kind_ == Kind::Bool ? double(b_) : f_; }
  const std::string& as_string() const { return s_ ? *s_ : empty_string(); }
  std::vector<Value>& items() const;  // Array
  ObjectData& attrs() const;          // Object / Namespace
  const Function& fn() const { return *fn_; }
  // Identity of a shared array/object/function (for == between them).
  const void* identity() const;

  bool truthy() const;
  // Text of the value when printed with {{ }} ("" for none/undefined).
  std::string to_output() const;
  const char* type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;  // shared: copying a Value never copies text
  static const std::string& empty_string();
  std::shared_ptr<ArrayData> arr_;
  std::shared_ptr<ObjectData> obj_;
  std::shared_ptr<Function> fn_;
};

struct ArrayData {
  std::vector<Value> items;
};

// Insertion-ordered string-keyed map (chat-template objects are small).
struct ObjectData {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Arguments of a call: positional, then keyword (in source order).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Positional i, else keyword `name`, else nullptr.
  const Value* get(size_t i, const std::string& name) const;
};

// JSON text as @huggingface/jinja's tojson writes it: ", " / ": " separators
// without indent, "," / ": " with one, strings escaped like JSON.stringify.
struct JsonOptions {
  int indent = -1;  // < 0: single line
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_sep, key_sep;  // empty: the defaults above
  bool undefined_as_null = true;
};
std::string to_json(const Value& v, const JsonOptions& opt = {}, int depth = 0);
// JavaScript's String(number): shortest round-trip digits, exponent form
// outside [1e-7, 1e21).
std::string js_number(double x);
// The "raw" text of a value as the reference's + and ~ operators use it
// (floats without a forced ".0", arrays comma-joined).
std::string raw_string(const Value& v);
// Strict equality (same type and value; shared containers by identity), as
// the `equalto` test and `in` over arrays use it.
bool strict_equal(const Value& a, const Value& b);
// Loose equality of ==: numbers and bools compare numerically, none ==
// undefined, strings by content, containers by identity.
bool loose_equal(const Value& a, const Value& b);

// Appends code point cp to out as UTF-8 (string escapes, |upper / |lower results).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace ptllm::jinja
