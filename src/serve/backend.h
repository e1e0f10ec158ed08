// The scheduler's view of the engine: start a sequence with its own cache and
// sampler, feed its prompt in chunks, run one decode step over many sequences.
// engine_backend.cc implements it with the engine; tests use a fake. Keeping
// the interface this small is what lets the batched forward (one call over B
// sequences, each with its own KVCache) replace the per-sequence loop in one
// file without touching the scheduler.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/cache_spec.h"
#include "sampling/logprobs.h"
#include "sampling/sampler.h"

namespace ptllm::serve {

// One running request's engine state (cache, sampler, logits). Opaque to the scheduler.
class Sequence {
 public:
  virtual ~Sequence() = default;
  virtual size_t kv_bytes() const = 0;          // payload + scale bytes its cache holds now
  virtual bool prefilled() const = 0;           // the whole prompt has been fed
  virtual int64_t prompt_remaining() const = 0;  // prompt tokens not yet fed
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Bytes (payload + scales) a cache of these settings holds when full: the
  // admission reservation. Thread-safe (called from HTTP threads); memoised.
  virtual size_t reservation_bytes(const CacheSpec& o) = 0;
  virtual int64_t context_length() const = 0;
  virtual bool is_eos(int32_t id) const = 0;
  // A sequence with its own cache (capacity = the context for an unbounded one).
  virtual std::unique_ptr<Sequence> start(std::vector<int32_t> prompt, const CacheSpec& o,
                                          const SamplerConfig& s) = 0;
  // Feeds the next min(max_tokens, remaining) prompt tokens. Chunk boundaries
  // depend only on the sequence and max_tokens, never on other sequences (batch
  // invariance).
  virtual void prefill(Sequence& seq, int64_t max_tokens) = 0;
  // prefill() of each of seqs; a sequence whose feeding failed gets the error
  // in errors[i] (errors has seqs.size() entries), the others go on. A backend
  // may feed several sequences together, but a sequence's arithmetic must not
  // depend on which others it is fed with (batch invariance).
  virtual void prefill_batch(std::span<Sequence* const> seqs, int64_t max_tokens, std::span<std::string> errors) {
    for (size_t i = 0; i < seqs.size(); ++i) try {
        prefill(*seqs[i], max_tokens);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
  }
  // One decode step: for every sequence, runs its last sampled token (if any)
  // through the model, then samples the next one into out[i]. seqs are prefilled.
  virtual void decode(std::span<Sequence* const> seqs, std::span<int32_t> out) = 0;
  // OpenAI's logprobs of the token the last decode() chose for seq (id = that token): from
  // the logits it was drawn from, raw (step_logprobs), with the `top` most likely.
  virtual StepLogprobs logprobs(const Sequence& seq, int32_t id, int top) const = 0;
  // From now on (before its first prefill), feeding seq's prompt records each prompt
  // token's logprobs after the first (token i from the logits after token i - 1), with the
  // `top` most likely; take_prompt_logprobs() hands them over once the prompt is fed.
  virtual void record_prompt_logprobs(Sequence& seq, int top) = 0;
  virtual std::vector<StepLogprobs> take_prompt_logprobs(Sequence& seq) = 0;
  // The sequence's cache cannot take another token (unbounded cache at the context).
  virtual bool full(const Sequence& seq) const = 0;
  // Keep finished sequences' caches for later ones with the same settings, so
  // that a new request finds its cache memory already resident: the caches
  // running plus those kept stay within `limit_bytes` (counted as
  // reservation_bytes each). Then make `warm` caches of `spec` now (as many as
  // fit), as llama-server allocates its slots' cache at start-up. Called once,
  // before the first start(). A backend without such memory ignores it.
  virtual void keep_caches(size_t /*limit_bytes*/, const CacheSpec& /*spec*/, int64_t /*warm*/) {}
  // Reservation bytes of the caches kept for later sequences (not running).
  virtual size_t kept_bytes() const { return 0; }
};

}  // namespace ptllm::serve
