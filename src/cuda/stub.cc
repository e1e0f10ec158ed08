// The CUDA backend when built without it (PTLLM_CUDA=OFF): --device cuda fails clearly.
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
bool built() { return false; }
void activate(const Model&, WeightType) {
  fail("--device cuda: this build has no CUDA backend (configure with -DPTLLM_CUDA=ON on a machine with nvcc)");
}
void deactivate() {}
std::string device_name() { return "none (built without CUDA)"; }

}  // namespace ptllm::cuda
