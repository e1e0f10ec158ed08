#include "engine/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>

#include "core/error.h"
#include "core/finite.h"

namespace ptllm {
namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

int64_t CacheState::max_stored() const { return stored.empty() ? 0 : *std::max_element(stored.begin(), stored.end()); }

CacheState cache_state(const KVCache& c) {
  CacheState s;
  s.position = c.position();
  for (int64_t l = 0; l < c.shape().n_layers; ++l) s.stored.push_back(c.stored(l));
  s.payload_bytes = c.payload_bytes();
  s.scale_bytes = c.scale_bytes();
  s.bounded = c.bounded();
  return s;
}

Decoder::Decoder(const Model& model, std::unique_ptr<KVCache> cache)
    : model_(model), cache_(std::move(cache)), logits_(size_t(model.config().vocab_size)) {
  if (!cache_) fail("Decoder: no cache");
}

void Decoder::prefill(std::span<const int32_t> ids, const ChunkLogits& on_chunk, int64_t max_chunk) {
  if (ids.empty()) fail("the prompt is empty (nothing to condition on)");
  const int64_t n = int64_t(ids.size()), V = model_.config().vocab_size;
  if (!cache_->bounded() && n > cache_->room())
    fail("prompt has {} tokens, longer than the context of {} tokens", n,
         std::min<int64_t>(cache_->room(), model_.config().max_position));
  const auto t0 = Clock::now();
  std::vector<float> all;
  for (int64_t off = 0; off < n;) {
    int64_t chunk = std::min<int64_t>(n - off, std::max<int64_t>(cache_->room(), 1));
    if (max_chunk > 0) chunk = std::min(chunk, max_chunk);
    if (on_chunk) {
      all.resize(size_t(chunk * V));
      model_.forward(ids.data() + off, chunk, *cache_, all.data(), /*all_logits=*/true);
      on_chunk(off, chunk, all.data());
      if (off + chunk == n) std::copy_n(all.data() + (chunk - 1) * V, V, logits_.data());
    } else {
      model_.forward(ids.data() + off, chunk, *cache_, logits_.data(), /*all_logits=*/false);
    }
    off += chunk;
  }
  require_finite_logits(logits_.data(), V, cache_->position() - 1);
  timing_.prefill_tokens += n;
  timing_.prefill_seconds += since(t0);
}

const std::vector<float>& Decoder::step(int32_t id) {
  if (!can_step()) fail("the cache ({}) is full after {} tokens", cache_->describe(), cache_->position());
  const auto t0 = Clock::now();
  model_.forward(&id, 1, *cache_, logits_.data(), /*all_logits=*/false);
  require_finite_logits(logits_.data(), int64_t(logits_.size()), cache_->position() - 1);
  timing_.decode_tokens += 1;
  timing_.decode_seconds += since(t0);
  return logits_;
}

size_t Decoder::step_bytes() const {
  return model_.step_weight_bytes() + cache_->payload_bytes() + cache_->scale_bytes();
}

void step_batch(std::span<Decoder* const> seqs, std::span<const int32_t> ids) {
  if (seqs.size() != ids.size()) fail("step_batch: {} sequences but {} ids", seqs.size(), ids.size());
  if (seqs.empty()) return;
  const Model& model = seqs[0]->model_;
  const int64_t B = int64_t(seqs.size()), V = model.config().vocab_size;
  std::vector<KVCache*> caches;
  for (Decoder* d : seqs) {
    if (&d->model_ != &model) fail("step_batch: the sequences belong to different models");
    caches.push_back(d->cache_.get());
  }
  const auto t0 = Clock::now();
  // [B, vocab], kept between steps: at batch 64 and a 128K vocabulary a fresh one is
  // 33 MB of page faults and zeroing per step.
  thread_local std::vector<float> logits;
  logits.resize(size_t(B * V));
  model.forward_batch(ids.data(), B, caches.data(), logits.data());
  const double s = since(t0);
  // Each sequence's row into its decoder and checked, the rows split across threads:
  // at batch 64 and a 128K vocabulary that is 33 MB to copy and check per step, which
  // on one thread was a sizeable part of a GPU batch step (docs/CUDA.md, "Session 22").
  // Every row is its own work, so no result depends on the split.
  // (`rows`, not `logits`, inside the loop: the worker threads have thread_locals of their own.)
  const float* const rows = logits.data();
  std::exception_ptr err;
#pragma omp parallel for schedule(static) if (B * V >= (int64_t(1) << 20))
  for (int64_t b = 0; b < B; ++b) {
    try {
      Decoder& d = *seqs[size_t(b)];
      std::copy_n(rows + b * V, V, d.logits_.data());
      require_finite_logits(d.logits_.data(), V, d.cache_->position() - 1);
      d.timing_.decode_tokens += 1;
      d.timing_.decode_seconds += s;
    } catch (...) {
#pragma omp critical(ptllm_step_batch_error)
      if (!err) err = std::current_exception();
    }
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace ptllm
