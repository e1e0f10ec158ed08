// Fuzzes one GGUF file: header, counts, every metadata value type, tensor
// infos, alignment, data ranges. After a successful parse every metadata value
// is read through its typed accessor and every tensor view is read end to end,
// so a string, array or view that escapes the mapping is an ASan finding.
#include "fuzz_util.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    ptllm::GgufFile f(path);
    unsigned sink = 0;
    for (const std::string& k : f.keys()) {
      const ptllm::GgufValue& v = f.value(k);
      try {
        switch (v.type) {
          case ptllm::GgufType::STRING: sink += unsigned(f.get_string(k).size()); break;
          case ptllm::GgufType::F32: case ptllm::GgufType::F64: sink += unsigned(f.get_f64(k) > 0); break;
          case ptllm::GgufType::BOOL: sink += f.get_bool(k); break;
          case ptllm::GgufType::ARRAY:
            if (v.elem == ptllm::GgufType::STRING) {
              for (const auto& s : f.get_string_array(k)) sink += fuzz::touch(s.data(), s.size());
            } else if (v.elem == ptllm::GgufType::F32 || v.elem == ptllm::GgufType::F64) {
              sink += unsigned(f.get_f32_array(k).size());
            } else if (v.elem != ptllm::GgufType::BOOL) {
              sink += unsigned(f.get_i64_array(k).size());  // u64 > 2^63 is an Error, caught below
            }
            if (f.array_size(k) != v.count) fuzz::finding("array_size disagrees for " + k);
            break;
          default: sink += unsigned(f.get_i64(k) & 1); break;  // u64 > 2^63 is an Error
        }
      } catch (const ptllm::Error& e) {
        fuzz::check_error(e);
      }
    }
    for (const auto& t : f.tensors()) {
      if (t.offset % f.alignment() != 0) fuzz::finding("misaligned tensor accepted: " + t.name);
      if (t.view.shape.size() != t.ne.size() || t.view.shape.front() != t.ne.back())
        fuzz::finding("shape is not reversed ne for " + t.name);
      sink += fuzz::touch(t.view.data, t.view.nbytes());
    }
    (void)sink;
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
