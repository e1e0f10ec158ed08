#include "core/memory.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <new>

#include "core/error.h"

#if defined(__linux__)
#include <sys/mman.h>
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

HugeRegion map_huge(size_t bytes, const char* what) {
  const size_t len = std::max<size_t>((bytes + kHugePage - 1) / kHugePage, 1) * kHugePage;
#if defined(__linux__)
  // One huge page more than needed, then the unaligned ends given back.
  void* raw = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) fail("{}: cannot allocate {} bytes ({})", what, len, std::strerror(errno));
  auto* base = static_cast<std::byte*>(raw);
  const size_t lead = (kHugePage - reinterpret_cast<uintptr_t>(base) % kHugePage) % kHugePage;
  if (lead) ::munmap(base, lead);
  if (kHugePage - lead) ::munmap(base + lead + len, kHugePage - lead);
  std::byte* p = base + lead;
#if defined(MADV_HUGEPAGE)
  ::madvise(p, len, MADV_HUGEPAGE);  // a hint: without THP the memory still works
#endif
  return {p, len};
#else
  auto* p = static_cast<std::byte*>(::operator new[](len, std::align_val_t(kHugePage), std::nothrow));
  if (!p) fail("{}: cannot allocate {} bytes", what, len);
  return {p, len};
#endif
}

void unmap_huge(const HugeRegion& r) {
  if (!r.p) return;
#if defined(__linux__)
  ::munmap(r.p, r.len);
#else
  ::operator delete[](r.p, std::align_val_t(kHugePage));
#endif
}

std::shared_ptr<std::byte[]> huge_buffer(size_t bytes, const char* what) {
  const HugeRegion r = map_huge(bytes, what);
  return std::shared_ptr<std::byte[]>(r.p, [r](std::byte*) { unmap_huge(r); });
}

}  // namespace ptllm
