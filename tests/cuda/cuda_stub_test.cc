// Built without CUDA: --device cuda is a one-line error, nothing else changes.
#include <gtest/gtest.h>

#include "core/error.h"
#include "cuda/backend.h"
#include "model/model.h"
#include "test_util.h"

namespace ptllm {
namespace {

TEST(CudaStub, ActivateExplainsTheBuildHasNoCuda) {
  EXPECT_FALSE(cuda::built());
  auto m = Model::load_hf(test::fixture("hf/llama-gqa-tied"));
  try {
    cuda::activate(*m);
    ADD_FAILURE() << "activate should fail without CUDA";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
  }
  cuda::EngineOptions invariant;
  invariant.batch_invariant = true;
  EXPECT_THROW(cuda::activate(*m, cuda::WeightType::Auto, invariant), Error);
}

TEST(CudaStub, WeightTypeFlagIsChecked) {
  EXPECT_EQ(cuda::parse_weight_type("bf16", "--device-weights"), cuda::WeightType::BF16);
  EXPECT_THROW(cuda::parse_weight_type("fp8", "--device-weights"), Error);
}

}  // namespace
}  // namespace ptllm
