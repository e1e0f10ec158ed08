// One forward step of a model a fuzz target accepted (its BOS, or id 0), so
// that shapes the loader let through are also run through the kernels.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/session.h"
#include "model/model.h"

namespace fuzz {

inline void forward_one(const ptllm::Model& model) {
  const auto& c = model.config();
  // See tests/fuzz/CMakeLists.txt: ops.cc is built for AVX-512 in this build.
  if (!__builtin_cpu_supports("avx512f")) return;
  auto cache = ptllm::make_default_cache(model, 2);
  std::vector<float> logits(size_t(c.vocab_size));
  const int32_t id = c.bos_id >= 0 && c.bos_id < c.vocab_size ? c.bos_id : 0;
  model.forward(&id, 1, *cache, logits.data(), false);
}

}  // namespace fuzz
