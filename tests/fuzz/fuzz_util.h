// Shared helpers for the libFuzzer targets. A target's contract: any input
// either loads/encodes or fails with a ptllm::Error whose message is one
// line. Every other exception type escapes LLVMFuzzerTestOneInput and
// libFuzzer reports it as a crash (std::terminate -> abort), as do ASan/UBSan
// reports, hangs (-timeout) and runaway memory (-rss_limit_mb).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace fuzz {

// Aborts (a libFuzzer finding) when an invariant the project promises breaks.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Checks the error-message contract (non-empty, one line).
inline void check_error(const ptllm::Error& e) {
  const std::string_view m = e.what();
  if (m.empty()) finding("ptllm::Error with an empty message");
  if (m.find('\n') != std::string_view::npos) finding("ptllm::Error message spans lines: " + std::string(m));
}

// An in-memory file with a path (/proc/self/fd/N) that the loaders can open
// and mmap like any regular file; rewritten for each input.
class MemFile {
 public:
  MemFile() {
    fd_ = memfd_create("ptllm-fuzz", 0);
    if (fd_ < 0) finding("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != ssize_t(size)) finding("memfd write failed");
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Sums every byte of a span so that ASan sees a read of each one.
inline unsigned touch(const void* p, size_t n) {
  const volatile unsigned char* b = static_cast<const unsigned char*>(p);
  unsigned s = 0;
  for (size_t i = 0; i < n; ++i) s += b[i];
  return s;
}

}  // namespace fuzz
