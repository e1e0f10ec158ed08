// Errors inside the Jinja engine. Internal code throws TemplateError with an
// offset into the template source when it knows one; the Template turns it
// into a ptllm::Error whose one line names the template and line:column.
#pragma once
#include <cstddef>
#include <string>

#include "core/error.h"

namespace ptllm::jinja {

constexpr size_t kNoPos = size_t(-1);

struct TemplateError {
  std::string message;
  size_t pos = kNoPos;  // byte offset in the original template text
  bool raised = false;  // from raise_exception() in the template itself
};

[[noreturn]] inline void fail_at(size_t pos, std::string msg) { throw TemplateError{std::move(msg), pos, false}; }
[[noreturn]] inline void fail_here(std::string msg) { throw TemplateError{std::move(msg), kNoPos, false}; }

// What a failed render throws: the message is "<name>:<line>:<col>: <what>".
class RenderError : public ptllm::Error {
 public:
  using ptllm::Error::Error;
};
// The template called raise_exception(msg): the conversation is one the
// template refuses (e.g. roles that do not alternate); a 400, not a bug.
class TemplateRaised : public RenderError {
 public:
  TemplateRaised(const std::string& msg, std::string raised) : RenderError(msg), raised_message(std::move(raised)) {}
  std::string raised_message;
};

}  // namespace ptllm::jinja
