// What the process itself costs, for the reports of sample and bench.
#pragma once
#include <cstdint>

namespace ptllm {

// Peak resident set size (VmHWM), KiB; -1 where unavailable. It includes
// file-backed pages of the mmapped weights (an embedding row is paged in the
// first time its token is seen), so the anonymous part is reported beside it.
int64_t peak_rss_kib();
// Current anonymous RSS (RssAnon: the cache, buffers), KiB; -1 where unavailable.
int64_t anon_rss_kib();
// CPU seconds used by the whole process (all threads).
double process_cpu_seconds();

}  // namespace ptllm
