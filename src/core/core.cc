#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace ptllm {

std::string one_line(const std::string& msg) {
  bool clean = true;
  for (unsigned char c : msg) clean = clean && c >= 0x20 && c != 0x7f;
  if (clean) return msg;
  std::string out;
  out.reserve(msg.size() + 8);
  for (unsigned char c : msg) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  return out;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I8: return "I8";
    case DType::I4: return "I4";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::Q8_0: return "Q8_0";
    case DType::Q4_0: return "Q4_0";
    case DType::Q4_1: return "Q4_1";
    case DType::Q5_0: return "Q5_0";
    case DType::Q5_1: return "Q5_1";
    case DType::Q4_K: return "Q4_K";
    case DType::Q5_K: return "Q5_K";
    case DType::Q6_K: return "Q6_K";
    case DType::Q4_0_R16: return "Q4_0_R16";
    case DType::Q4_K_R16: return "Q4_K_R16";
    case DType::Q8_0_R16: return "Q8_0_R16";
  }
  return "?";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace ptllm
