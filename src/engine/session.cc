#include "engine/session.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "io/mmap.h"
#include "kv/cache_options.h"
#include "model/gguf_model.h"
#include "tokenizer/gguf_file.h"

namespace ptllm {

namespace fs = std::filesystem;

std::string default_model_path() {
  if (const char* env = std::getenv("PTLLM_MODEL")) return env;
  // The executable lives in <repo>/build/...; the bundled model in <repo>/models.
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    fs::path cand = dir / "models" / "flagship-27m.tinygpt";
    if (fs::is_regular_file(cand, ec)) return cand.string();
  }
  return "models/flagship-27m.tinygpt";
}

LoadedModel load_model(const std::string& path) {
  if (!file_exists(path) && !is_directory(path)) fail("{}: no such file or folder", path);
  LoadedModel lm;
  if (is_directory(path)) {
    lm.model = Model::load_hf(path);
    const std::string tok = path + "/tokenizer.json";
    if (file_exists(tok)) lm.tokenizer = std::make_shared<Tokenizer>(Tokenizer::from_file(tok));
  } else if (path.size() > 8 && path.ends_with(".tinygpt")) {
    std::string tok_json;
    lm.model = Model::load_tinygpt(path, &tok_json);
    if (!tok_json.empty()) lm.tokenizer = std::make_shared<Tokenizer>(Tokenizer::from_json(tok_json));
  } else if (path.size() > 5 && path.ends_with(".gguf")) {
    std::shared_ptr<const GgufFile> gguf;
    lm.model = load_gguf_model(path, &gguf);
    lm.add_bos = gguf->find_bool("tokenizer.ggml.add_bos_token").value_or(true);
    if (gguf->has("tokenizer.ggml.model")) lm.tokenizer = std::make_shared<Tokenizer>(tokenizer_from_gguf(*gguf));
  } else {
    fail("{}: expected a model folder (config.json + safetensors), a .tinygpt or a .gguf file", path);
  }
  const auto& c = lm.model->config();
  lm.eos_ids = c.eos_ids;
  lm.bos_id = c.bos_id;
  if (lm.tokenizer) {
    if (lm.eos_ids.empty() && lm.tokenizer->eos_id()) lm.eos_ids.push_back(*lm.tokenizer->eos_id());
    if (lm.bos_id < 0 && lm.tokenizer->bos_id()) lm.bos_id = *lm.tokenizer->bos_id();
  }
  return lm;
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

std::unique_ptr<KVCache> make_default_cache(const Model& model, int64_t tokens_needed) {
  const int64_t cap = std::min<int64_t>(model.config().max_position, std::max<int64_t>(tokens_needed, 1));
  return make_cache(model.cache_shape(cap), CacheOptions{});
}

namespace {
// A NaN/Inf in the logits would otherwise be sampled silently (the sampler
// then picks an arbitrary id); one pass over [vocab] per forward is cheap
// next to the forward itself. `position` is that of the token just run.
void check_finite(const std::vector<float>& logits, int64_t position) {
  for (float v : logits)
    if (!std::isfinite(v)) fail("non-finite logits at position {}", position);
}
}  // namespace

Session::Session(const LoadedModel& lm, std::unique_ptr<KVCache> cache) : lm_(lm), cache_(std::move(cache)) {}

GenerateStats Session::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                const OnToken& on_token) {
  using clock = std::chrono::steady_clock;
  const auto& cfg = lm_.model->config();
  if (prompt.empty()) fail("the prompt is empty (nothing to condition on)");
  if (opt.max_new_tokens < 0) fail("--tokens {}: expected >= 0", opt.max_new_tokens);
  if (!cache_->bounded() && int64_t(prompt.size()) > cache_->room())
    fail("prompt has {} tokens, longer than the context of {} tokens", prompt.size(),
         std::min<int64_t>(cache_->room(), cfg.max_position));
  Sampler sampler(opt.sampler);
  GenerateStats st;
  st.prompt_tokens = int64_t(prompt.size());
  logits_.assign(size_t(cfg.vocab_size), 0.f);

  auto t0 = clock::now();
  // A bounded cache may hold fewer tokens than the prompt: feed it in chunks it can take.
  for (size_t off = 0; off < prompt.size();) {
    const int64_t chunk = std::min<int64_t>(int64_t(prompt.size() - off), std::max<int64_t>(cache_->room(), 1));
    lm_.model->forward(prompt.data() + off, chunk, *cache_, logits_.data(), false);
    off += size_t(chunk);
  }
  check_finite(logits_, cache_->position() - 1);
  auto t1 = clock::now();
  st.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  st.stop = StopReason::Length;
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    const int32_t id = sampler.sample(logits_);
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
    if (cache_->room() < 1) {
      st.stop = StopReason::Context;
      break;
    }
    lm_.model->forward(&id, 1, *cache_, logits_.data(), false);
    check_finite(logits_, cache_->position() - 1);
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return st;
}

}  // namespace ptllm
