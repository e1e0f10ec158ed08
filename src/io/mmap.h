// A whole file, read-only in memory, in its stored bytes (a bf16 model
// occupies its file size, not twice it), brought in one of two ways:
//
//   Map   mmap of the file: the pages are the page cache's, shared with every
//         process that maps the file (llama.cpp's default).
//   Read  the file read into anonymous memory, advised for transparent huge
//         pages, then made read-only. A decode step streams every weight once,
//         and with 4 KiB pages the hardware prefetchers stop at every page
//         boundary and each page costs a TLB miss: on the 1B shape in bf16
//         Read decodes 35-45% faster than Map (docs/BENCHMARKS.md, "Session
//         12"). The page cache may hold a second, reclaimable copy.
//
// Where huge pages or pread are not available Read still works (4 KiB pages).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace ptllm {

enum class FileLoad { Map, Read };

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path, FileLoad how = FileLoad::Map);  // throws Error naming path
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  // Read only: makes the whole pages of [p, p + n) writable, runs fn on them
  // (this object's private copy, e.g. to re-lay a tensor in place) and makes
  // them read-only again. Returns false without running fn for a mapped file
  // (its pages are the page cache's) or a range outside the file.
  bool rewrite(const std::byte* p, size_t n, const std::function<void(std::byte*)>& fn);
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void map(int fd);
  void read(int fd);
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes of the mapping (Read: rounded up to the huge-page size)
  bool read_ = false;  // Read: anonymous memory of our own
};

// Whole file as a string; throws Error naming the path.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace ptllm
