// What both builds of the backend share (backend.cc with CUDA, stub.cc without).
#include "core/error.h"
#include "cuda/backend.h"

namespace ptllm::cuda {

WeightType parse_weight_type(const std::string& text, const std::string& flag) {
  if (text == "auto") return WeightType::Auto;
  if (text == "f32") return WeightType::F32;
  if (text == "bf16") return WeightType::BF16;
  if (text == "f16") return WeightType::F16;
  fail("{} {}: expected auto, f32, bf16 or f16", flag, text);
}

}  // namespace ptllm::cuda
