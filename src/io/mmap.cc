#include "io/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/memory.h"

namespace ptllm {

MappedFile::MappedFile(const std::string& path, FileLoad how) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open ({})", path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  size_ = size_t(st.st_size);
  try {
    if (size_ > 0) {
      if (how == FileLoad::Read) read(fd);
      else map(fd);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

void MappedFile::map(int fd) {
  // MAP_POPULATE faults every page in now: weights are all read on the first
  // token anyway, and a process whose resident size is fixed after loading
  // is what a memory-bounded run needs to see (no RSS creep as new
  // embedding rows are touched thousands of tokens in).
#if defined(MAP_POPULATE)
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
#else
  // No MAP_POPULATE (macOS): map, then read one byte of every page, which
  // faults them in as MAP_POPULATE would (after a read-ahead hint).
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p != MAP_FAILED) {
    ::madvise(p, size_, MADV_WILLNEED);
    const long page = ::sysconf(_SC_PAGESIZE) > 0 ? ::sysconf(_SC_PAGESIZE) : 4096;
    unsigned sum = 0;
    for (size_t off = 0; off < size_; off += size_t(page)) sum += static_cast<const volatile unsigned char*>(p)[off];
    (void)sum;
  }
#endif
  if (p == MAP_FAILED) fail("{}: mmap failed ({})", path_, std::strerror(errno));
  data_ = static_cast<const std::byte*>(p);
  mapped_ = size_;
}

void MappedFile::read(int fd) {
  // The start is aligned to a huge page (the over-allocation's ends are
  // unmapped again) so every whole 2 MiB of the file can sit in one.
  const HugeRegion region = map_huge(size_, path_.c_str());
  const size_t len = region.len;
  std::byte* p = region.p;
  size_t done = 0;
  while (done < size_) {
    const ssize_t r = ::pread(fd, p + done, std::min<size_t>(size_ - done, size_t(1) << 30), off_t(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const std::string why = r < 0 ? std::strerror(errno) : "the file ended early";
      ::munmap(p, len);
      fail("{}: read failed at byte {} of {} ({})", path_, done, size_, why);
    }
    done += size_t(r);
  }
  // Read-only from here on, as a mapping of the file would be.
  ::mprotect(p, len, PROT_READ);
  data_ = p;
  mapped_ = len;
  read_ = true;
}

bool MappedFile::rewrite(const std::byte* p, size_t n, const std::function<void(std::byte*)>& fn) {
  const auto at = reinterpret_cast<uintptr_t>(p), base_at = reinterpret_cast<uintptr_t>(data_);
  if (!read_ || !data_ || at < base_at || n > size_ || at - base_at > size_ - n) return false;
  // Whole huge pages (the mapping starts on one, read()): a protection
  // change that splits one at a tensor's edge would leave it in 4 KiB pages.
  const size_t off = size_t(p - data_), first = off / kHugePage * kHugePage;
  const size_t last = std::min(mapped_, (off + n + kHugePage - 1) / kHugePage * kHugePage);
  auto* base = const_cast<std::byte*>(data_);
  if (::mprotect(base + first, last - first, PROT_READ | PROT_WRITE) != 0)
    fail("{}: cannot make bytes {}..{} writable ({})", path_, off, off + n, std::strerror(errno));
  try {
    fn(base + off);
  } catch (...) {
    ::mprotect(base + first, last - first, PROT_READ);
    throw;
  }
  ::mprotect(base + first, last - first, PROT_READ);
  return true;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), mapped_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), mapped_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    read_ = o.read_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.mapped_ = 0;
  }
  return *this;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace ptllm
