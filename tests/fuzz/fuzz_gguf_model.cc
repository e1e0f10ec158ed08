// Fuzzes GGUF model loading (load_gguf_model): {arch}.* metadata ->
// ModelConfig, tensor names/shapes -> Model, llama's Q/K un-permutation,
// rope_freqs. A model that loads satisfies the config invariants and runs one
// decode step (a 2-slot cache), so the views the loader accepted are read.
#include <vector>

#include "fuzz_forward.h"
#include "fuzz_util.h"
#include "model/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  const std::string& path = file.write(data, size);
  try {
    std::shared_ptr<const ptllm::GgufFile> gguf;
    auto model = ptllm::load_gguf_model(path, &gguf);
    const auto& c = model->config();
    if (c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
        c.head_dim % 2 || c.n_heads % c.n_kv_heads || c.vocab_size <= 0 || !(c.rms_eps > 0) || !(c.rope.theta > 0))
      fuzz::finding("accepted an inconsistent config: " + c.summary());
    if (c.vocab_size != gguf->tensor("token_embd.weight").rows()) fuzz::finding("vocab != token_embd rows");
    fuzz::forward_one(*model);
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
