#include "serve/jinja.h"

#include <algorithm>

#include "serve/jinja_ast.h"
#include "serve/jinja_eval.h"

namespace ptllm::jinja {

struct Template::Parsed {
  Block program;
};

Template::Template(std::string source, std::string name)
    : source_(std::move(source)), name_(std::move(name)), parsed_(std::make_unique<Parsed>()) {
  try {
    parsed_->program = parse(tokenize(source_), source_.size());
  } catch (const TemplateError& e) {
    rethrow(e);
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

void Template::rethrow(const TemplateError& e) const {
  std::string where = name_;
  if (e.pos != kNoPos) {
    size_t pos = std::min(e.pos, source_.size());
    size_t line = 1 + size_t(std::count(source_.begin(), source_.begin() + long(pos), '\n'));
    size_t line_start = source_.rfind('\n', pos == 0 ? 0 : pos - 1);
    size_t col = line_start == std::string::npos || pos == 0 ? pos + 1 : pos - line_start;
    where = fmt::format("{}:{}:{}", name_, line, col);
  }
  std::string msg = e.message;
  std::replace(msg.begin(), msg.end(), '\n', ' ');  // errors are one line
  if (e.raised) throw TemplateRaised(fmt::format("{}: raise_exception: {}", where, msg), e.message);
  throw RenderError(fmt::format("{}: {}", where, msg));
}

std::string Template::render(const nlohmann::ordered_json& context, std::function<std::tm()> now) const {
  if (!context.is_object()) throw RenderError(name_ + ": the render context must be a JSON object");
  if (!now)
    now = [] {
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      return tm;
    };
  Env globals;
  install_globals(globals, now);
  Env vars(&globals);
  Interpreter interp;
  try {
    for (const auto& [k, v] : context.items()) vars.set(k, Value::from_json(v));
    return interp.render(parsed_->program, vars);
  } catch (const TemplateError& e) {
    rethrow(e);
  }
}

}  // namespace ptllm::jinja
