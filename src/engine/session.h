// Generation session: a model, its tokenizer and a KV cache; runs prefill then
// the decode loop and keeps the statistics a user sees at the end.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/decoder.h"
#include "kv/cache_spec.h"
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
struct LoadOptions {
  // `--weights`: every 2-D weight re-encoded as this type on load
  // (Model::with_weight_type); nullopt = as stored in the file.
  std::optional<DType> weights;
  // How the model's files come into memory (io/mmap.h): read into memory
  // with huge pages (the default: decode streams every weight once per
  // token) or `--mmap`ped (shared with other processes through the page cache).
  // With `weights` set the files are always mapped (load_model says why).
  FileLoad file_load = FileLoad::Read;
  // Q8_0, Q4_0 and Q4_K matrices re-laid in 16-row groups (core/dtype.h) where the
  // current SIMD level has a kernel for that (ops::rows16_pays: AVX-512 VNNI)
  // and the bytes are private (read in, or made by --weights); a --mmap'ed
  // file's stay as stored. Q4_0: the same logits either way; Q8_0 and Q4_K:
  // the same exact integer sums, added in another fp32 order.
  bool relay_weights = true;
};
LoadedModel load_model(const std::string& path, const LoadOptions& opt = {});
// The bundled default model (models/flagship-27m.tinygpt in the repo the executable was built in, or $PTLLM_MODEL).
std::string default_model_path();

// The prompt as ids: BOS first unless !add_bos; an empty prompt is BOS alone.
// Throws when the model has no tokenizer, the prompt is empty and there is no
// BOS, or the prompt is longer than the model's context.
std::vector<int32_t> encode_prompt(const LoadedModel& lm, const std::string& text, bool add_bos);

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

// Sampling on top of a Decoder: prefill, then sample / stop conditions / step.
class Session {
 public:
  Session(const LoadedModel& lm, std::unique_ptr<KVCache> cache);
  // Called with each generated id; return false to stop.
  using OnToken = std::function<bool(int32_t id)>;
  // Prefills `prompt` (must be non-empty) then samples up to max_new_tokens.
  GenerateStats generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt, const OnToken& on_token);
  KVCache& cache() { return decoder_.cache(); }
  const Decoder& decoder() const { return decoder_; }
  const std::vector<float>& last_logits() const { return decoder_.logits(); }

 private:
  const LoadedModel& lm_;
  Decoder decoder_;
};

// A cache for `model` from `spec` for a run of tokens_needed tokens: an
// unbounded cache holds min(context length, tokens_needed); a bounded one
// sink + window slots whatever the length.
std::unique_ptr<KVCache> make_model_cache(const Model& model, const CacheSpec& spec, int64_t tokens_needed);
// The same with the default spec (fp32, unbounded).
inline std::unique_ptr<KVCache> make_default_cache(const Model& model, int64_t tokens_needed) {
  return make_model_cache(model, CacheSpec{}, tokens_needed);
}

}  // namespace ptllm
