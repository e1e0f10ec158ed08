// Populating fresh memory without a page fault per 4 KiB.
//
// A first write to an untouched page traps into the kernel, which zero-fills
// it; under a virtual machine with shadow paging the hypervisor then traps the
// first access again. Measured on the 2-core Zen 5 VM this project runs on
// (a 64 MiB anonymous mapping): 19 us per 4 KiB page by touching alone;
// MADV_POPULATE_WRITE 1.1 us per page, but the first touch after it still
// 14 us (the host's side); a second touch 0.03 us. A KV cache that fills page
// by page pays those faults in the middle of decode steps: at 16 served
// sequences of flagship-27m (fp32, head_dim 32, so a new page per head every
// 32 tokens) one step in 32 took 3-4x the others.
#pragma once
#include <cstddef>
#include <memory>

namespace ptllm {

// Makes every whole page inside [p, p + bytes) resident by one read and
// write-back per page, which changes no byte. Not MADV_POPULATE_WRITE: it
// saves a fifth on fresh pages, but walks resident ones at ~1 us a page, and
// a server mostly re-populates memory a finished request gave back. Pages
// only partly inside the range are left alone (they may belong to other
// allocations).
void populate_pages(void* p, size_t bytes);

// x86-64's transparent huge page.
constexpr size_t kHugePage = size_t(2) << 20;
// Anonymous read-write memory of `bytes` rounded up to whole huge pages,
// starting on one, advised for transparent huge pages (this project's VM
// runs THP in "madvise" mode: memory gets them only when asked). Weights
// read per token want them (fewer TLB misses; docs/BENCHMARKS.md, session
// 12). len: what was mapped, for unmap_huge. Throws, naming `what`, when
// the memory cannot be had.
struct HugeRegion {
  std::byte* p = nullptr;
  size_t len = 0;
};
HugeRegion map_huge(size_t bytes, const char* what);
void unmap_huge(const HugeRegion& r);
// The same owned by a shared_ptr (freed by unmap_huge).
std::shared_ptr<std::byte[]> huge_buffer(size_t bytes, const char* what);

}  // namespace ptllm
