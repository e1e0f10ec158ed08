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
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string_view>

#include "core/error.h"
#include "core/finite.h"
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

// Caches of finished sequences, cleared, kept for the next sequence with the
// same settings (keyed by the canonical spec). Why: the first touch of a fresh
// page costs ~15 us on this project's VM (core/memory.h), and a cache made per
// request is either faulted in at admission (KVCache::populate: a 16-request
// burst of fp32 flagship-27m caches, ~7,000 faults) or inside decode steps that
// every running stream waits for. A reused cache is already resident, and
// clear() makes it behave as a new one bit for bit (tests/kv/cache_test.cc,
// ClearedCacheBehavesAsFresh). Accounting is in reservation bytes: live (held
// by running sequences) + idle (kept here) <= limit, the server's --kv-budget,
// so keeping caches never lets memory pass what the budget admits.
// Thread-safe: sequences end on the scheduler's thread, start() runs there too,
// but the pool is shared with every EngineSequence.
class CachePool {
 public:
  void set_limit(size_t bytes) {
    std::lock_guard lk(mu_);
    limit_ = bytes;
  }
  // A kept cache of `key`, or null; counts `bytes` as live either way.
  std::unique_ptr<KVCache> take(const std::string& key, size_t bytes) {
    std::lock_guard lk(mu_);
    live_ += bytes;
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->key == key) {
        auto c = std::move(it->cache);
        idle_bytes_ -= it->bytes;
        idle_.erase(it);
        return c;
      }
    // A new cache will be made: free the oldest kept ones it would not fit beside.
    while (!idle_.empty() && live_ + idle_bytes_ > limit_) {
      idle_bytes_ -= idle_.front().bytes;
      idle_.erase(idle_.begin());
    }
    return nullptr;
  }
  // A sequence's cache (null: none was made), no longer live: kept if it fits.
  void give(const std::string& key, std::unique_ptr<KVCache> cache, size_t bytes) {
    {
      std::lock_guard lk(mu_);
      live_ -= std::min(live_, bytes);
    }
    if (cache) keep(key, std::move(cache), bytes);
  }
  // Kept (cleared) if it fits beside the live and kept caches, else freed.
  void keep(const std::string& key, std::unique_ptr<KVCache> cache, size_t bytes) {
    cache->clear();
    std::lock_guard lk(mu_);
    if (live_ + idle_bytes_ + bytes > limit_) return;  // freed on return
    idle_.push_back({key, std::move(cache), bytes});
    idle_bytes_ += bytes;
  }
  size_t idle_bytes() const {
    std::lock_guard lk(mu_);
    return idle_bytes_;
  }
 private:
  struct Kept {
    std::string key;
    std::unique_ptr<KVCache> cache;
    size_t bytes = 0;
  };
  mutable std::mutex mu_;
  std::vector<Kept> idle_;  // oldest first
  size_t limit_ = 0, live_ = 0, idle_bytes_ = 0;
};

class EngineSequence : public Sequence {
 public:
  EngineSequence(std::unique_ptr<KVCache> cache, std::vector<int32_t> prompt, const SamplerConfig& s, int64_t vocab)
      : cache(std::move(cache)), prompt(std::move(prompt)), sampler(s), logits(size_t(vocab), 0.f) {}
  ~EngineSequence() override {
    if (pool) pool->give(pool_key, std::move(cache), pool_bytes);
  }
  size_t kv_bytes() const override { return cache->payload_bytes() + cache->scale_bytes(); }
  bool prefilled() const override { return fed == prompt.size(); }
  int64_t prompt_remaining() const override { return int64_t(prompt.size() - fed); }

  std::unique_ptr<KVCache> cache;
  std::vector<int32_t> prompt;
  size_t fed = 0;
  Sampler sampler;
  std::vector<float> logits;  // [vocab] of the last token run
  int32_t pending = -1;       // sampled, not yet run through the model
  // record_prompt_logprobs: -1 off, else the top count; prompt token i's (i >= 1) in
  // prompt_lp[i - 1] as the prompt is fed.
  int prompt_top = -1;
  std::vector<StepLogprobs> prompt_lp;
  // Where the cache goes when the sequence ends (null: freed).
  std::shared_ptr<CachePool> pool;
  std::string pool_key;
  size_t pool_bytes = 0;
};

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
    // An unbounded cache holds the context (cache_shape's capacity), a bounded one any length.
    if (!o.streaming() && int64_t(prompt.size()) > context_length())
      fail("prompt: {} tokens, longer than the model's context of {} tokens", prompt.size(), context_length());
    const int64_t vocab = lm_.model->config().vocab_size;
    const std::string key = options_key(o);
    const size_t bytes = reservation_bytes(o);
    auto cache = pool_->take(key, bytes);
    if (!cache) {
      try {
        cache = new_cache(o);
      } catch (...) {
        pool_->give(key, nullptr, bytes);
        throw;
      }
    }
    const bool device = dynamic_cast<const DeviceKVCache*>(cache.get()) != nullptr;
    auto seq = std::make_unique<EngineSequence>(std::move(cache), std::move(prompt), s, vocab);
    if (device) {
      pool_->give(key, nullptr, bytes);  // device memory is not kept: freed with the sequence
    } else {
      seq->pool = pool_;
      seq->pool_key = key;
      seq->pool_bytes = bytes;
    }
    return seq;
  }

  void keep_caches(size_t limit_bytes, const CacheSpec& spec, int64_t warm) override {
    pool_->set_limit(limit_bytes);
    const std::string key = options_key(spec);
    const size_t bytes = reservation_bytes(spec);
    std::vector<std::unique_ptr<KVCache>> made;
    for (int64_t i = 0; i < warm && bytes > 0 && size_t(i + 1) * bytes <= limit_bytes; ++i) {
      auto c = new_cache(spec);
      if (dynamic_cast<const DeviceKVCache*>(c.get())) break;  // allocated whole when made: nothing to warm
      made.push_back(std::move(c));
    }
    for (auto& c : made) pool_->keep(key, std::move(c), bytes);
  }
  size_t kept_bytes() const override { return pool_->idle_bytes(); }

  void record_prompt_logprobs(Sequence& seq, int top) override {
    auto& s = static_cast<EngineSequence&>(seq);
    if (s.fed != 0) fail("prompt logprobs: asked for after the prompt's first chunk");
    s.prompt_top = std::min<int>(top, int(s.logits.size()));
  }
  std::vector<StepLogprobs> take_prompt_logprobs(Sequence& seq) override {
    return std::move(static_cast<EngineSequence&>(seq).prompt_lp);
  }

  void prefill(Sequence& base, int64_t max_tokens) override {
    auto& s = static_cast<EngineSequence&>(base);
    int64_t left = std::min<int64_t>(max_tokens, s.prompt_remaining());
    const size_t vocab = s.logits.size();
    // A bounded cache may take fewer tokens per forward than the chunk.
    while (left > 0) {
      const int64_t n = std::min<int64_t>(left, std::max<int64_t>(s.cache->room(), 1));
      if (s.prompt_top < 0) {
        lm_.model->forward(s.prompt.data() + s.fed, n, *s.cache, s.logits.data(), false);
      } else {
        // Every position's logits [n, vocab]: position j's score prompt token fed + j + 1.
        all_logits_.resize(size_t(n) * vocab);
        lm_.model->forward(s.prompt.data() + s.fed, n, *s.cache, all_logits_.data(), true);
        for (int64_t j = 0; j < n; ++j) {
          const size_t next = s.fed + size_t(j) + 1;
          if (next >= s.prompt.size()) break;
          const std::span<const float> row(all_logits_.data() + size_t(j) * vocab, vocab);
          require_finite_logits(row.data(), int64_t(vocab), int64_t(s.fed) + j);
          s.prompt_lp.push_back(step_logprobs(row, s.prompt[next], s.prompt_top));
        }
        std::copy_n(all_logits_.data() + size_t(n - 1) * vocab, vocab, s.logits.data());
      }
      s.fed += size_t(n);
      left -= n;
    }
    if (s.prefilled()) require_finite_logits(s.logits.data(), int64_t(s.logits.size()), s.cache->position() - 1);
  }

  // Short prompts (at most 16 tokens, within one chunk and within their cache's room)
  // admitted in one scheduler step run together through one Model::forward_prompts:
  // all their tokens are the rows of one pass, so each weight is read once for all of
  // them, where a forward() per prompt reads every weight once per prompt and stepping
  // them one position at a time through forward_batch (sessions 9-22) once per position.
  // Measured (flagship-27m, docs/SERVER.md "Prompts in one pass, session 23"): one
  // request's 10-token prompt admitted and prefilled in 2.5 ms, 9.9 ms stepped.
  // Batch invariance holds: whether a prompt takes this path depends only on its own
  // length and cache, and forward_prompts gives each sequence what it gives it alone.
  // On a device cache (src/cuda) the prompts are still stepped through forward_batch,
  // which runs them batched on the GPU (forward_prompts there runs each prompt alone).
  // PTLLM_SERVE_SHORT_PROMPT=N changes the limit (0: every prompt through its own
  // forward()); PTLLM_SERVE_PROMPTS=stepped steps them as before, for A/B runs.
  static int64_t short_prompt_limit() {
    static const int64_t n = [] {
      const char* e = std::getenv("PTLLM_SERVE_SHORT_PROMPT");
      return e && *e ? std::max<int64_t>(0, std::atoll(e)) : int64_t(16);
    }();
    return n;
  }
  static bool step_short_prompts() {
    static const bool stepped = [] {
      const char* e = std::getenv("PTLLM_SERVE_PROMPTS");
      return e && std::string_view(e) == "stepped";
    }();
    return stepped;
  }

  void prefill_batch(std::span<Sequence* const> seqs, int64_t max_tokens, std::span<std::string> errors) override {
    std::vector<EngineSequence*> together;
    std::vector<size_t> together_at;  // index in seqs
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto& s = static_cast<EngineSequence&>(*seqs[i]);
      const int64_t len = int64_t(s.prompt.size());
      if (s.fed == 0 && s.prompt_top < 0 && len >= 1 && len <= std::min(short_prompt_limit(), max_tokens) &&
          len <= s.cache->room()) {
        together.push_back(&s);
        together_at.push_back(i);
        continue;
      }
      try {
        prefill(s, max_tokens);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
    if (together.empty()) return;
    try {
      if (step_short_prompts() || dynamic_cast<const DeviceKVCache*>(together[0]->cache.get()))
        step_prompts(together);
      else
        run_prompts(together);
    } catch (const std::exception& e) {
      for (size_t i : together_at) errors[i] = e.what();
    }
  }

  StepLogprobs logprobs(const Sequence& seq, int32_t id, int top) const override {
    const auto& s = static_cast<const EngineSequence&>(seq);
    return step_logprobs(s.logits, id, std::min<int>(top, int(s.logits.size())));
  }

  void decode(std::span<Sequence* const> seqs, std::span<int32_t> out) override {
    // Sequences with a token sampled but not yet run go through one batched forward.
    clear_rows();
    batch_row_.assign(seqs.size(), -1);
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto& s = static_cast<EngineSequence&>(*seqs[i]);
      if (s.pending < 0) continue;
      batch_row_[i] = int64_t(run_.size());
      add_row(s, s.pending);
    }
    forward_rows();
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
        if (const int64_t row = batch_row_[size_t(i)]; row >= 0) {
          const size_t vocab = s.logits.size();
          std::copy_n(batch_logits_.data() + size_t(row) * vocab, vocab, s.logits.data());
          require_finite_logits(s.logits.data(), int64_t(s.logits.size()), s.cache->position() - 1);
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

  // The whole prompts of `seqs` in one Model::forward_prompts; each sequence keeps
  // the logits of its last token.
  void run_prompts(const std::vector<EngineSequence*>& seqs) {
    tokens_.clear();
    caches_.clear();
    counts_.clear();
    for (const EngineSequence* s : seqs) {
      tokens_.insert(tokens_.end(), s->prompt.begin(), s->prompt.end());
      caches_.push_back(s->cache.get());
      counts_.push_back(int64_t(s->prompt.size()));
    }
    const size_t vocab = size_t(lm_.model->config().vocab_size);
    batch_logits_.resize(seqs.size() * vocab);
    lm_.model->forward_prompts(tokens_.data(), counts_.data(), int64_t(seqs.size()), caches_.data(),
                               batch_logits_.data());
    for (size_t b = 0; b < seqs.size(); ++b) {
      EngineSequence& s = *seqs[b];
      s.fed = s.prompt.size();
      std::copy_n(batch_logits_.data() + b * vocab, vocab, s.logits.data());
      require_finite_logits(s.logits.data(), int64_t(vocab), s.cache->position() - 1);
    }
  }

  // Feeds the whole prompts of `seqs` one position at a time: call t runs token
  // t of every prompt longer than t; a sequence keeps the logits of its last.
  void step_prompts(const std::vector<EngineSequence*>& seqs) {
    size_t longest = 0;
    for (const EngineSequence* s : seqs) longest = std::max(longest, s->prompt.size());
    const size_t vocab = size_t(lm_.model->config().vocab_size);
    for (size_t t = 0; t < longest; ++t) {
      clear_rows();
      for (EngineSequence* s : seqs)
        if (s->prompt.size() > t) add_row(*s, s->prompt[t]);
      forward_rows();
      for (size_t r = 0; r < run_.size(); ++r) {
        EngineSequence& s = *run_[r];
        s.fed = t + 1;
        if (s.prefilled()) {
          std::copy_n(batch_logits_.data() + r * vocab, vocab, s.logits.data());
          require_finite_logits(s.logits.data(), int64_t(s.logits.size()), s.cache->position() - 1);
        }
      }
    }
  }

  // The rows of one Model::forward_batch (decode's step, or one position of
  // step_prompts): a sequence and the token it runs. forward_rows() leaves
  // row r's logits at batch_logits_[r * vocab].
  void clear_rows() {
    run_.clear();
    tokens_.clear();
    caches_.clear();
  }
  void add_row(EngineSequence& s, int32_t token) {
    run_.push_back(&s);
    tokens_.push_back(token);
    caches_.push_back(s.cache.get());
  }
  void forward_rows() {
    if (run_.empty()) return;
    batch_logits_.resize(run_.size() * size_t(lm_.model->config().vocab_size));
    lm_.model->forward_batch(tokens_.data(), int64_t(run_.size()), caches_.data(), batch_logits_.data());
  }

  // A made cache, resident in full: its reservation counts the whole cache, so
  // it is faulted in now, one syscall per buffer, rather than page by page
  // inside later decode steps that every running sequence waits for.
  std::unique_ptr<KVCache> new_cache(const CacheSpec& o) const {
    auto cache = make_cache(lm_.model->cache_shape(context_length()), o);
    cache->populate();
    return cache;
  }

  bool full(const Sequence& base) const override {
    const auto& s = static_cast<const EngineSequence&>(base);
    return s.cache->room() < 1;
  }

 private:
  const LoadedModel& lm_;
  std::mutex mu_;
  std::map<std::string, size_t> memo_;
  // Limit 0 (keeps nothing) until keep_caches() sets the budget.
  std::shared_ptr<CachePool> pool_ = std::make_shared<CachePool>();
  // Rows of one forward_batch (the scheduler's thread only; add_row).
  std::vector<EngineSequence*> run_;
  std::vector<int32_t> tokens_;
  std::vector<KVCache*> caches_;
  std::vector<int64_t> counts_;      // run_prompts: each sequence's tokens
  std::vector<int64_t> batch_row_;   // [seqs]: the sequence's row in batch_logits_, -1 if it did not run
  std::vector<float> batch_logits_;  // [B, vocab]
  std::vector<float> all_logits_;    // [chunk, vocab]: a prompt chunk's every position (prompt logprobs)
};

}  // namespace

std::unique_ptr<Backend> make_engine_backend(const LoadedModel& lm) { return std::make_unique<EngineBackend>(lm); }

}  // namespace ptllm::serve
