// Generation session: a model, its tokenizer and a KV cache; runs prefill then
// the decode loop and keeps the statistics a user sees at the end.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

// A model with its tokenizer, loaded from a Hugging Face folder.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::shared_ptr<Tokenizer> tokenizer;  // null when the folder has no tokenizer.json
  std::vector<int32_t> eos_ids;          // from generation_config / config / tokenizer
  int32_t bos_id = -1;
  bool add_bos = true;  // GGUF: tokenizer.ggml.add_bos_token (default true)
};
LoadedModel load_model(const std::string& path);
// The bundled default model (models/flagship-27m.tinygpt in the repo the executable was built in, or $PTLLM_MODEL).
std::string default_model_path();

enum class StopReason { Eos, Length, Context, Interrupted };
std::string_view stop_reason_name(StopReason r);

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  bool ignore_eos = false;
  SamplerConfig sampler;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  StopReason stop = StopReason::Length;
  double prefill_tps() const { return prefill_seconds > 0 ? double(prompt_tokens) / prefill_seconds : 0; }
  double decode_tps() const { return decode_seconds > 0 ? double(generated_tokens) / decode_seconds : 0; }
};

class Session {
 public:
  Session(const LoadedModel& lm, std::unique_ptr<KVCache> cache);
  // Called with each generated id; return false to stop.
  using OnToken = std::function<bool(int32_t id)>;
  // Prefills `prompt` (must be non-empty) then samples up to max_new_tokens.
  GenerateStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt, const OnToken& on_token);
  KVCache& cache() { return *cache_; }
  const std::vector<float>& last_logits() const { return logits_; }

 private:
  const LoadedModel& lm_;
  std::unique_ptr<KVCache> cache_;
  std::vector<float> logits_;
};

// Default cache for a model when no cache flags are given: fp32, capacity =
// min(context length, tokens needed).
std::unique_ptr<KVCache> make_default_cache(const Model& model, int64_t tokens_needed);

}  // namespace ptllm
