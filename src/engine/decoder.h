// The decode loop every command runs (sample, perplexity, compare, bench and,
// next, the server): one sequence = a model, its own KV cache, the last
// logits and timing. prefill() feeds a prompt in chunks the cache can take;
// step() runs one token; step_batch() steps several independent sequences
// together through Model::forward_batch.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace ptllm {

struct DecodeTiming {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tps() const { return prefill_seconds > 0 ? double(prefill_tokens) / prefill_seconds : 0; }
  double decode_tps() const { return decode_seconds > 0 ? double(decode_tokens) / decode_seconds : 0; }
};

// What the cache holds now.
struct CacheState {
  int64_t position = 0;                 // tokens seen (monotonic)
  std::vector<int64_t> stored;          // tokens held per cache layer
  size_t payload_bytes = 0, scale_bytes = 0;
  bool bounded = false;
  int64_t max_stored() const;
  size_t bytes() const { return payload_bytes + scale_bytes; }
};
CacheState cache_state(const KVCache& c);

class Decoder {
 public:
  Decoder(const Model& model, std::unique_ptr<KVCache> cache);

  // All logits of one prefill chunk: tokens [first, first + n) of the ids
  // passed to prefill(), logits [n, vocab].
  using ChunkLogits = std::function<void(int64_t first, int64_t n, const float* logits)>;
  // Feeds ids (non-empty) at the cache's position, in chunks of at most
  // max_chunk tokens and what the cache has room() for (a full bounded cache
  // takes one per step). The last token's logits are in logits(); with
  // on_chunk, every token's logits are computed and handed over per chunk.
  // An unbounded cache that cannot hold them all is an error.
  void prefill(std::span<const int32_t> ids, const ChunkLogits& on_chunk = {}, int64_t max_chunk = 0);
  // One token; its logits in logits(). Throws when the cache is full.
  const std::vector<float>& step(int32_t id);
  // Whether step() can take another token (an unbounded cache ends at its capacity).
  bool can_step() const { return cache_->room() >= 1; }

  const std::vector<float>& logits() const { return logits_; }
  const Model& model() const { return model_; }
  KVCache& cache() { return *cache_; }
  const KVCache& cache() const { return *cache_; }
  const DecodeTiming& timing() const { return timing_; }
  // Bytes the next decode step reads: the model's weights (step_weight_bytes)
  // and the whole cache.
  size_t step_bytes() const;

 private:
  friend void step_batch(std::span<Decoder* const>, std::span<const int32_t>);
  const Model& model_;
  std::unique_ptr<KVCache> cache_;
  std::vector<float> logits_;  // [vocab]
  DecodeTiming timing_;
};

// One decode step of every sequence: ids[b] into seqs[b] (each with its own
// cache, all of one model). Each sequence's logits() are bit-identical to
// seqs[b]->step(ids[b]) run alone. The step's time counts for every sequence.
void step_batch(std::span<Decoder* const> seqs, std::span<const int32_t> ids);

}  // namespace ptllm
