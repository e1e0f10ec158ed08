// What the process itself costs, for the reports of sample and bench.
#pragma once
#include <cstdint>
#include <string>

namespace ptllm {

// Peak resident set size (VmHWM; getrusage's ru_maxrss where /proc is
// missing, e.g. macOS), KiB; -1 where unavailable. It includes
// file-backed pages of the mmapped weights (an embedding row is paged in the
// first time its token is seen), so the anonymous part is reported beside it.
int64_t peak_rss_kib();
// Current anonymous RSS (RssAnon: the cache, buffers; on macOS the task's
// physical footprint), KiB; -1 where unavailable.
int64_t anon_rss_kib();
// Anonymous memory in transparent huge pages (AnonHugePages of
// /proc/self/smaps_rollup), KiB; -1 where unavailable. Shows whether the
// weights read into memory (FileLoad::Read) got the huge pages they asked for.
int64_t anon_huge_kib();
// CPU seconds used by the whole process (all threads).
double process_cpu_seconds();
// Absolute path of the running executable (/proc/self/exe on Linux,
// _NSGetExecutablePath on macOS); empty where unknown.
std::string self_exe_path();

}  // namespace ptllm
