// Fuzzes a whole .tinygpt file through Model::load_tinygpt: the safetensors
// container, the metadata, the config, tensor names/shapes/dtypes and the
// embedded tokenizer. A model that loads runs one decode step (a 2-slot
// cache), so views the loader accepted are really read.
#include <vector>

#include "fuzz_forward.h"
#include "fuzz_util.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    std::string tok_json;
    auto model = ptllm::Model::load_tinygpt(path, &tok_json);
    if (!tok_json.empty()) {
      const ptllm::Tokenizer tok = ptllm::Tokenizer::from_json(tok_json);
      (void)tok.decode(tok.encode("Once upon a time"));
    }
    fuzz::forward_one(*model);
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
