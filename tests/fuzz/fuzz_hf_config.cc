// Fuzzes config.json parsing (parse_hf_config): types, ranges, rope variants.
// A config that parses must describe a shape the forward pass can size.
#include "fuzz_util.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ptllm::ModelConfig c = ptllm::parse_hf_config(text, "config.json");
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
        c.head_dim <= 0 || c.head_dim % 2 || c.n_heads % c.n_kv_heads || c.max_position <= 0 || c.sliding_window < 0)
      fuzz::finding("parse_hf_config accepted an unusable shape: " + c.summary());
    (void)c.summary();
  } catch (const ptllm::Error& e) {
    fuzz::check_error(e);
  }
  return 0;
}
