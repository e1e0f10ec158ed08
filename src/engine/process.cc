#include "engine/process.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#if defined(__APPLE__)
#include <mach-o/dyld.h>
#include <mach/mach.h>
#endif

namespace ptllm {
namespace {
// A "Name: N kB" field of /proc/self/status (or another such file) in KiB,
// or -1 where unavailable.
int64_t proc_status_kib(const char* field, const char* file = "/proc/self/status") {
  FILE* f = std::fopen(file, "r");
  if (!f) return -1;
  char line[256];
  int64_t kib = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      kib = std::strtoll(line + n + 1, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kib;
}

// getrusage's ru_maxrss: KiB on Linux, bytes on macOS. Used where
// /proc/self/status is missing (macOS, a container without /proc).
int64_t rusage_peak_kib() {
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return -1;
#if defined(__APPLE__)
  return int64_t(ru.ru_maxrss) / 1024;
#else
  return int64_t(ru.ru_maxrss);
#endif
}
}  // namespace

int64_t peak_rss_kib() {
  const int64_t kib = proc_status_kib("VmHWM");
  return kib >= 0 ? kib : rusage_peak_kib();
}
int64_t anon_huge_kib() { return proc_status_kib("AnonHugePages", "/proc/self/smaps_rollup"); }

int64_t anon_rss_kib() {
#if defined(__APPLE__)
  // No RssAnon on macOS: the physical footprint (anonymous + compressed
  // memory, file-backed pages excluded) is its closest counterpart.
  task_vm_info_data_t info{};
  mach_msg_type_number_t count = TASK_VM_INFO_COUNT;
  if (task_info(mach_task_self(), TASK_VM_INFO, reinterpret_cast<task_info_t>(&info), &count) != KERN_SUCCESS)
    return -1;
  return int64_t(info.phys_footprint / 1024);
#else
  return proc_status_kib("RssAnon");
#endif
}

std::string self_exe_path() {
#if defined(__APPLE__)
  char buf[4096];
  uint32_t size = sizeof buf;
  if (_NSGetExecutablePath(buf, &size) != 0) return {};
  std::error_code ec;
  const auto p = std::filesystem::canonical(buf, ec);
  return ec ? std::string(buf) : p.string();
#else
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
#endif
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace ptllm
