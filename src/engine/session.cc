#include "engine/session.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "engine/process.h"
#include "io/mmap.h"
#include "model/gguf_model.h"
#include "tokenizer/gguf_file.h"

namespace ptllm {

namespace fs = std::filesystem;

std::string default_model_path() {
  if (const char* env = std::getenv("PTLLM_MODEL")) return env;
  // The executable lives in <repo>/build/...; the bundled model in <repo>/models.
  std::error_code ec;
  fs::path exe = self_exe_path();
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    fs::path cand = dir / "models" / "flagship-27m.tinygpt";
    if (fs::is_regular_file(cand, ec)) return cand.string();
  }
  return "models/flagship-27m.tinygpt";
}

LoadedModel load_model(const std::string& path, const LoadOptions& opt) {
  if (!file_exists(path) && !is_directory(path)) fail("{}: no such file or folder", path);
  // With --weights the matrices are re-encoded into owned buffers and the
  // file's copies are never read again, but the model keeps its files (the
  // norms are views of them): mapped, those pages stay reclaimable; read
  // into anonymous memory they would be pinned. So --weights maps.
  const FileLoad how = opt.weights ? FileLoad::Map : opt.file_load;
  LoadedModel lm;
  if (is_directory(path)) {
    lm.model = Model::load_hf(path, how);
    const std::string tok = path + "/tokenizer.json";
    if (file_exists(tok)) lm.tokenizer = std::make_shared<Tokenizer>(Tokenizer::from_file(tok));
  } else if (path.size() > 8 && path.ends_with(".tinygpt")) {
    std::string tok_json;
    lm.model = Model::load_tinygpt(path, &tok_json, how);
    if (!tok_json.empty()) lm.tokenizer = std::make_shared<Tokenizer>(Tokenizer::from_json(tok_json));
  } else if (path.size() > 5 && path.ends_with(".gguf")) {
    std::shared_ptr<const GgufFile> gguf;
    lm.model = load_gguf_model(path, &gguf, how, opt.relay_weights && !opt.weights);
    lm.add_bos = gguf->find_bool("tokenizer.ggml.add_bos_token").value_or(true);
    if (gguf->has("tokenizer.ggml.model")) lm.tokenizer = std::make_shared<Tokenizer>(tokenizer_from_gguf(*gguf));
  } else {
    fail("{}: expected a model folder (config.json + safetensors), a .tinygpt or a .gguf file", path);
  }
  if (opt.weights) lm.model = Model::with_weight_type(std::move(lm.model), *opt.weights, opt.relay_weights);
  const auto& c = lm.model->config();
  lm.eos_ids = c.eos_ids;
  lm.bos_id = c.bos_id;
  if (lm.tokenizer) {
    if (lm.eos_ids.empty() && lm.tokenizer->eos_id()) lm.eos_ids.push_back(*lm.tokenizer->eos_id());
    if (lm.bos_id < 0 && lm.tokenizer->bos_id()) lm.bos_id = *lm.tokenizer->bos_id();
  }
  return lm;
}

std::vector<int32_t> encode_prompt(const LoadedModel& lm, const std::string& text, bool add_bos) {
  if (!lm.tokenizer) fail("{}: no tokenizer.json beside the model (needed to encode --prompt)", lm.model->source());
  std::vector<int32_t> ids = lm.tokenizer->encode(text, add_bos);
  if (ids.empty()) {
    if (lm.bos_id < 0) fail("--prompt is empty and the model has no BOS token to start from");
    ids.push_back(lm.bos_id);
  }
  const int64_t ctx = lm.model->config().max_position;
  if (int64_t(ids.size()) > ctx)
    fail("--prompt: {} tokens is longer than the model's context of {} tokens", ids.size(), ctx);
  return ids;
}

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Eos: return "eos";
    case StopReason::Length: return "length";
    case StopReason::Context: return "context";
    case StopReason::Interrupted: return "interrupted";
  }
  return "?";
}

std::unique_ptr<KVCache> make_model_cache(const Model& model, const CacheSpec& spec, int64_t tokens_needed) {
  const int64_t cap = std::min<int64_t>(model.config().max_position, std::max<int64_t>(tokens_needed, 1));
  return make_cache(model.cache_shape(cap), spec);
}

Session::Session(const LoadedModel& lm, std::unique_ptr<KVCache> cache)
    : lm_(lm), decoder_(*lm.model, std::move(cache)) {}

GenerateStats Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                const OnToken& on_token) {
  if (prompt.empty()) fail("the prompt is empty (nothing to condition on)");
  if (opt.max_new_tokens < 0) fail("--tokens {}: expected >= 0", opt.max_new_tokens);
  Sampler sampler(opt.sampler);
  GenerateStats st;
  st.prompt_tokens = int64_t(prompt.size());
  const DecodeTiming before = decoder_.timing();
  decoder_.prefill(prompt);
  const auto t1 = std::chrono::steady_clock::now();

  st.stop = StopReason::Length;
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t id = sampler.sample(decoder_.logits());
    ++st.generated_tokens;
    const bool is_eos = std::find(lm_.eos_ids.begin(), lm_.eos_ids.end(), id) != lm_.eos_ids.end();
    if (!on_token(id)) {
      st.stop = StopReason::Interrupted;
      break;
    }
    if (is_eos && !opt.ignore_eos) {
      st.stop = StopReason::Eos;
      break;
    }
    if (i + 1 == opt.max_new_tokens) break;
    if (!decoder_.can_step()) {
      st.stop = StopReason::Context;
      break;
    }
    decoder_.step(id);
  }
  // Decode time is the whole loop (sampling and the callback included), as before.
  st.prefill_seconds = decoder_.timing().prefill_seconds - before.prefill_seconds;
  st.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return st;
}

}  // namespace ptllm
