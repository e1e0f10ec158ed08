// The CUDA backend when built without it (PTLLM_CUDA=OFF): --device cuda fails clearly.
#include "core/error.h"
#include "cuda/backend.h"

namespace ptllm::cuda {

bool built() { return false; }
void activate(const Model&, WeightType, const EngineOptions&) {
  fail("--device cuda: this build has no CUDA backend (configure with -DPTLLM_CUDA=ON on a machine with nvcc)");
}
void deactivate() {}
std::string device_name() { return "none (built without CUDA)"; }

}  // namespace ptllm::cuda
