// Fuzzes the "config" metadata of a .tinygpt file (parse_tinygpt_config).
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ptllm::ModelConfig c = ptllm::parse_tinygpt_config(text, "model.tinygpt");
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
        c.head_dim <= 0 || c.head_dim % 2 || c.n_heads % c.n_kv_heads || c.max_position <= 0 ||
        c.yoco_self_layers < 0 || c.yoco_self_layers >= c.n_layers)
      fuzz::finding("parse_tinygpt_config accepted an unusable shape: " + c.summary());
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
