// Error type used across posttrainllm. Every user-facing failure is a
// ptllm::Error whose message is a single line naming the file/flag and what
// was expected; the CLI prints it as "error: <message>" and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>
#include <fmt/format.h>

namespace ptllm {

// Names inside a message come from the files and requests being read (a
// tensor name, a shard file name, a JSON key), so they may hold newlines or
// other control bytes. Error escapes those (\n, \r, \t, \xNN) so the
// one-line promise holds whatever the input was.
std::string one_line(const std::string& msg);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(one_line(msg)) {}
};

// fail("{}: expected {}", path, what) -> throws Error with a formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ptllm
