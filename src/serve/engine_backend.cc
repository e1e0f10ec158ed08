// The serving backend on the engine: prompts are prefilled per sequence in
// chunks (Model::forward), and each decode step is one Model::forward_batch
// over every running sequence (each with its own cache): the projections and
// the MLP read every weight once per step for all users, attention runs per
// sequence over its own cache, and each sequence's logits are bit-identical
// to stepping it alone (batch invariance, tests/engine/decoder_test.cc).
#include "serve/engine_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>

#include "core/error.h"
#include "model/device_cache.h"
#include <nlohmann/json.hpp>

namespace ptllm::serve {

size_t full_cache_bytes(const Model& model, const CacheSpec& o) {
  const int64_t ctx = model.config().max_position;
  auto cache = make_cache(model.cache_shape(ctx), o);
  // A device cache (`--device cuda`) allocates its whole capacity when it is
  // made, so that is what a request holds; it cannot be fed here either (the
  // per-layer append is the CPU path: the device runs whole model steps).
  if (const auto* d = dynamic_cast<const DeviceKVCache*>(cache.get())) return d->device_bytes();
  const KVCacheShape& sh = cache->shape();
  // Past the window, a KIVI cache still moves tokens between its residual and
  // its quantised groups; two residuals + two groups more covers a full cycle.
  const int64_t target =
      cache->bounded() ? o.sink + o.window + 2 * (o.kivi_residual + std::max<int64_t>(o.kivi_group, 1)) : ctx;
  const int64_t chunk = 64;
  std::vector<float> k(size_t(chunk * sh.n_kv_heads * sh.head_dim), 0.5f), v = k;
  size_t most = 0;
  for (int64_t fed = 0; fed < target;) {
    const int64_t n = std::min({chunk, target - fed, std::max<int64_t>(cache->room(), 1)});
    if (!cache->bounded() && cache->room() < 1) break;
    for (int64_t l = 0; l < sh.n_layers; ++l) cache->append(l, k.data(), v.data(), n);
    cache->advance(n);
    fed += n;
    most = std::max(most, cache->payload_bytes() + cache->scale_bytes());
  }
  return most;
}

namespace {

class EngineSequence : public Sequence {
 public:
  EngineSequence(std::unique_ptr<KVCache> cache, std::vector<int32_t> prompt, const SamplerConfig& s, int64_t vocab)
      : cache(std::move(cache)), prompt(std::move(prompt)), sampler(s), logits(size_t(vocab), 0.f) {}
  size_t kv_bytes() const override { return cache->payload_bytes() + cache->scale_bytes(); }
  bool prefilled() const override { return fed == prompt.size(); }
  int64_t prompt_remaining() const override { return int64_t(prompt.size() - fed); }

  std::unique_ptr<KVCache> cache;
  std::vector<int32_t> prompt;
  size_t fed = 0;
  Sampler sampler;
  std::vector<float> logits;  // [vocab] of the last token run
  int32_t pending = -1;       // sampled, not yet run through the model
};

// A NaN/Inf would otherwise be sampled as an arbitrary id.
void check_finite(const std::vector<float>& logits, int64_t position) {
  for (float x : logits)
    if (!std::isfinite(x)) fail("non-finite logits at position {}", position);
}

// Memo key: every field that changes the cache's size.
std::string options_key(const CacheSpec& o) { return o.canonical().to_json().dump(); }

class EngineBackend : public Backend {
 public:
  explicit EngineBackend(const LoadedModel& lm) : lm_(lm) {}

  size_t reservation_bytes(const CacheSpec& o) override {
    const std::string key = options_key(o);
    {
      std::lock_guard lk(mu_);
      if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    }
    const size_t b = full_cache_bytes(*lm_.model, o);
    std::lock_guard lk(mu_);
    memo_[key] = b;
    return b;
  }

  int64_t context_length() const override { return lm_.model->config().max_position; }

  bool is_eos(int32_t id) const override {
    return std::find(lm_.eos_ids.begin(), lm_.eos_ids.end(), id) != lm_.eos_ids.end();
  }

  std::unique_ptr<Sequence> start(std::vector<int32_t> prompt, const CacheSpec& o,
                                  const SamplerConfig& s) override {
    if (prompt.empty()) fail("prompt: empty (nothing to condition on)");
    auto cache = make_cache(lm_.model->cache_shape(context_length()), o);
    if (!cache->bounded() && int64_t(prompt.size()) > cache->room())
      fail("prompt: {} tokens, longer than the model's context of {} tokens", prompt.size(), context_length());
    // The reservation already counts the whole cache: make it resident now, in
    // one syscall per buffer, rather than by page faults inside later decode
    // steps (each step of every running sequence would wait for them).
    cache->populate();
    return std::make_unique<EngineSequence>(std::move(cache), std::move(prompt), s, lm_.model->config().vocab_size);
  }

  void prefill(Sequence& base, int64_t max_tokens) override {
    auto& s = static_cast<EngineSequence&>(base);
    int64_t left = std::min<int64_t>(max_tokens, s.prompt_remaining());
    // A bounded cache may take fewer tokens per forward than the chunk.
    while (left > 0) {
      const int64_t n = std::min<int64_t>(left, std::max<int64_t>(s.cache->room(), 1));
      lm_.model->forward(s.prompt.data() + s.fed, n, *s.cache, s.logits.data(), false);
      s.fed += size_t(n);
      left -= n;
    }
    if (s.prefilled()) check_finite(s.logits, s.cache->position() - 1);
  }

  void decode(std::span<Sequence* const> seqs, std::span<int32_t> out) override {
    // Sequences with a token sampled but not yet run go through one batched forward.
    run_.clear();
    tokens_.clear();
    caches_.clear();
    for (Sequence* base : seqs) {
      auto& s = static_cast<EngineSequence&>(*base);
      if (s.pending < 0) continue;
      run_.push_back(&s);
      tokens_.push_back(s.pending);
      caches_.push_back(s.cache.get());
    }
    if (!run_.empty()) {
      const size_t vocab = size_t(lm_.model->config().vocab_size);
      batch_logits_.resize(run_.size() * vocab);
      lm_.model->forward_batch(tokens_.data(), int64_t(run_.size()), caches_.data(), batch_logits_.data());
    }
    // Per sequence: its logits out of the batch, the finiteness check and its
    // sampler (a full pass over the vocabulary each: at 16 sequences of a
    // 32,000-token vocabulary ~1/3 of a step on one thread). Each sequence's
    // work is its own (its own sampler and RNG), so splitting it across
    // threads changes no result.
    const int64_t n = int64_t(seqs.size());
    std::exception_ptr err;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int64_t i = 0; i < n; ++i) {
      try {
        auto& s = static_cast<EngineSequence&>(*seqs[size_t(i)]);
        const auto it = std::find(run_.begin(), run_.end(), &s);
        if (it != run_.end()) {
          const size_t vocab = s.logits.size();
          std::copy_n(batch_logits_.data() + size_t(it - run_.begin()) * vocab, vocab, s.logits.data());
          check_finite(s.logits, s.cache->position() - 1);
        }
        s.pending = s.sampler.sample(s.logits);
        out[size_t(i)] = s.pending;
      } catch (...) {
#pragma omp critical(ptllm_serve_sample_error)
        if (!err) err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
  }

  bool full(const Sequence& base) const override {
    const auto& s = static_cast<const EngineSequence&>(base);
    return s.cache->room() < 1;
  }

 private:
  const LoadedModel& lm_;
  std::mutex mu_;
  std::map<std::string, size_t> memo_;
  // decode() scratch (the scheduler's thread only): the batch of one step.
  std::vector<EngineSequence*> run_;
  std::vector<int32_t> tokens_;
  std::vector<KVCache*> caches_;
  std::vector<float> batch_logits_;  // [B, vocab]
};

}  // namespace

std::unique_ptr<Backend> make_engine_backend(const LoadedModel& lm) { return std::make_unique<EngineBackend>(lm); }

}  // namespace ptllm::serve
