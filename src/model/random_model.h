// Random-weight Llama models written straight to GGUF, for benchmarks and
// loader tests at real sizes (Llama 3.2 1B, Llama 3.1 8B shapes) without
// downloading weights. Weights ~ N(0, std), norms 1, so activations stay
// finite; every tensor is generated row by row while it is written (an 8B f16
// file is 16 GB and never in memory). Reproducible: one seed, one file.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/config.h"

namespace ptllm {

struct RandomModelOptions {
  ModelConfig config;  // family Llama; shape fields used
  DType type = DType::F16;
  uint64_t seed = 1;
  float std = 0.02f;
  std::string name = "random";
};

// "llama-3.2-1b" (hidden 2048, 16 layers, 32/8 heads, FFN 8192, vocab 128256,
// tied) or "llama-3.1-8b" (4096, 32 layers, 32/8 heads, 14336, 128256, untied).
ModelConfig random_model_preset(const std::string& preset);
// Writes the GGUF (architecture llama, a byte-fallback vocabulary of
// config.vocab_size tokens so llama.cpp loads it).
void write_random_gguf(const std::string& path, const RandomModelOptions& opt);

}  // namespace ptllm
