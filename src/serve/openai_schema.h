// OpenAI-compatible request parsing and validation, and the error shape.
// Every rejected field names itself in the message and in "param".
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "kv/cache_spec.h"
#include "sampling/sampler.h"

namespace ptllm::serve {

// An error the client sees as {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string type = "invalid_request_error",
           std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};
nlohmann::json error_json(const ApiError& e);

// The most tokens a request may ask to see beside each generated one (OpenAI's chat limit).
constexpr int kMaxTopLogprobs = 20;

// Sampling and stopping parameters shared by both endpoints.
struct GenParams {
  int64_t max_tokens = 16;
  SamplerConfig sampler;      // temperature (default 1), top_p, top_k, seed, penalties, logit_bias
  bool seeded = false;        // "seed" given; otherwise the server picks one
  std::vector<std::string> stop;
  bool stream = false;
  bool ignore_eos = false;    // llama-server's extension
  // OpenAI's logprobs: -1 off, else how many most likely tokens to list beside each
  // generated one (completions: "logprobs": N; chat: "logprobs": true, "top_logprobs": N).
  int logprobs = -1;
  bool echo = false;  // completions: the prompt's text (and with logprobs its tokens') first
  CacheSpec cache;         // "kv_cache" over the server's defaults
};

struct CompletionRequest {
  std::string model;
  std::variant<std::string, std::vector<int32_t>> prompt;
  GenParams gen;
};

struct ChatRequest {
  std::string model;
  nlohmann::json messages;  // validated: array of {"role": string, "content": string|null|parts}
  GenParams gen;
};

// Body text -> JSON object; 400 "invalid JSON" otherwise.
nlohmann::json parse_body(const std::string& body);
// `vocab` bounds token-id prompts and logit_bias's ids.
CompletionRequest parse_completion(const nlohmann::json& body, const CacheSpec& defaults, int32_t vocab);
ChatRequest parse_chat(const nlohmann::json& body, const CacheSpec& defaults, int32_t vocab);
// The "kv_cache" extension object over the server's defaults; an unknown field
// or a bad value is a 400 naming "kv_cache.<field>". (The one function to
// swap for the engine's cache-spec from_json.)
CacheSpec parse_kv_cache(const nlohmann::json& obj, const CacheSpec& defaults);

}  // namespace ptllm::serve
