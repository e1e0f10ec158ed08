#include "core/memory.h"

#include <cstdint>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace ptllm {

void populate_pages(void* p, size_t bytes) {
  if (!p || bytes == 0) return;
#if defined(__linux__)
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(p) + page - 1) & ~(page - 1);
  const uintptr_t end = (uintptr_t(p) + bytes) & ~(page - 1);
  if (end <= begin) return;
  for (uintptr_t a = begin; a < end; a += page) {
    volatile unsigned char* b = reinterpret_cast<volatile unsigned char*>(a);
    *b = *b;
  }
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace ptllm
