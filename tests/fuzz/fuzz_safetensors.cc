// Fuzzes one safetensors file: header length, JSON header, dtypes, shapes,
// data_offsets. After a successful load every tensor view is read end to end,
// so a view that escapes the mapping is an ASan finding.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    ptllm::TensorStore store;
    store.add_file(path);
    for (const auto& [name, t] : store.all()) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= uint64_t(d);
      if (t.nbytes() != numel * ptllm::dtype_size(t.dtype)) fuzz::finding("nbytes disagrees with the shape of " + name);
      fuzz::touch(t.data, t.nbytes());
    }
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
