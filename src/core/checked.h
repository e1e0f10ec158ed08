// Overflow-checked size arithmetic for anything derived from file contents.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/error.h"

namespace ptllm {

inline uint64_t checked_mul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail("{}: size overflows 64 bits", what);
  return r;
}
inline uint64_t checked_add(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail("{}: size overflows 64 bits", what);
  return r;
}

}  // namespace ptllm
