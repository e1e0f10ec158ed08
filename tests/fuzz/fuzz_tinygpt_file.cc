// Fuzzes a whole .tinygpt file through Model::load_tinygpt: the safetensors
// container, the metadata, the config, tensor names/shapes/dtypes and the
// embedded tokenizer. A model that loads runs one decode step (a 2-slot
// cache), so views the loader accepted are really read.
#include <vector>

#include "engine/session.h"
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
    const auto& c = model->config();
    // See tests/fuzz/CMakeLists.txt: ops.cc is built for AVX-512 in this build.
    if (!__builtin_cpu_supports("avx512f")) return 0;
    auto cache = ptllm::make_default_cache(*model, 2);
    std::vector<float> logits(size_t(c.vocab_size));
    const int32_t id = c.bos_id >= 0 && c.bos_id < c.vocab_size ? c.bos_id : 0;
    model->forward(&id, 1, *cache, logits.data(), false);
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
