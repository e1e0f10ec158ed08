// A small Jinja engine for chat templates: the subset real Hugging Face
// chat_template strings use (for/if/set/macro/filter/call blocks, namespace(),
// loop variables, filters, tests, string and dict methods, slices,
// raise_exception, strftime_now), rendered with HF's whitespace rules
// (trim_blocks + lstrip_blocks). Checked against @huggingface/jinja.
//
//   jinja::Template t(source, "tokenizer_config.json");
//   std::string s = t.render(context);   // context: a JSON object of variables
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/jinja_error.h"

namespace ptllm::jinja {

struct Node;

class Template {
 public:
  // Parses `source` now; a syntax error throws RenderError naming `name`
  // and the line:column.
  Template(std::string source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the JSON object's keys as variables. `now` is the clock of
  // strftime_now (local time of the system clock when empty). Throws
  // TemplateRaised for raise_exception(), RenderError for anything else.
  std::string render(const nlohmann::ordered_json& context, std::function<std::tm()> now = {}) const;

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }

 private:
  [[noreturn]] void rethrow(const TemplateError& e) const;
  std::string source_, name_;
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace ptllm::jinja
