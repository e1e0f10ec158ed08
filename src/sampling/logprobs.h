// Log-probabilities of a step's tokens, as OpenAI's `logprobs` return them: the chosen
// token's and the `top` most likely, from the model's own distribution (log-softmax of the
// raw logits, before temperature, penalties or bias, as vLLM returns them by default).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace ptllm {

struct TokenLogprob {
  int32_t id = -1;
  double logprob = 0;
};

struct StepLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first; ties by lower id
};

// logits [vocab], finite. top in [0, vocab]; `chosen` in [0, vocab). Throws Error otherwise.
StepLogprobs step_logprobs(std::span<const float> logits, int32_t chosen, int top);

}  // namespace ptllm
