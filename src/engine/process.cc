#include "engine/process.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace ptllm {
namespace {
// A "Name: N kB" field of /proc/self/status in KiB, or -1 where unavailable.
int64_t proc_status_kib(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
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
}  // namespace

int64_t peak_rss_kib() { return proc_status_kib("VmHWM"); }
int64_t anon_rss_kib() { return proc_status_kib("RssAnon"); }

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace ptllm
