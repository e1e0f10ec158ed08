// Fuzzes a sharded checkpoint: input = index JSON, a NUL byte, then the bytes
// of shard "a.safetensors". The folder also holds a fixed valid shard
// "b.safetensors" (tensor "b.weight"), so indexes naming one, both, neither,
// missing files or paths outside the folder are all reachable.
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {
std::string make_dir() {
  char tmpl[] = "/tmp/ptllm-fuzz-index-XXXXXX";
  if (!mkdtemp(tmpl)) fuzz::finding("mkdtemp failed");
  const std::string dir = tmpl;
  const float w[6] = {1, 2, 3, 4, 5, 6};
  ptllm::write_safetensors(dir + "/b.safetensors", {{"b.weight", ptllm::DType::F32, {2, 3}, w}});
  return dir;
}
void put(const std::string& path, const uint8_t* p, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(p), std::streamsize(n));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = make_dir();
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t index_len = nul ? size_t(nul - data) : size;
  put(dir + "/model.safetensors.index.json", data, index_len);
  if (nul) put(dir + "/a.safetensors", nul + 1, size - index_len - 1);
  else unlink((dir + "/a.safetensors").c_str());
  try {
    ptllm::TensorStore store = ptllm::TensorStore::open_hf_dir(dir);
    for (const auto& [name, t] : store.all()) fuzz::touch(t.data, t.nbytes());
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
