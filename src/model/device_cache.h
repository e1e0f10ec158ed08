// A KV cache that lives on an accelerator together with the model's weights
// (src/cuda). Model::forward / forward_batch hand such a cache the whole step:
// embeddings, every layer and the logits run on the device, and only the logits
// come back. The per-layer append/attend interface of KVCache is not used.
#pragma once
#include <cstdint>

#include "core/error.h"
#include "kv/kv_cache.h"

namespace ptllm {

class DeviceKVCache : public KVCache {
 public:
  using KVCache::KVCache;
  // Model::forward of tokens[0..n) at position(): logits [n, vocab] or [vocab]; advances.
  virtual void forward(const int32_t* tokens, int64_t n, float* logits, bool all_logits) = 0;
  // Model::forward_batch: one token per cache, caches[0] == this; all caches
  // are device caches of the same backend. logits [B, vocab].
  virtual void forward_batch(const int32_t* tokens, int64_t B, KVCache* const* caches, float* logits) = 0;
  // Makes this cache hold exactly what `other` holds (a device cache of the same
  // backend, shape and settings): a device-side copy, no model run (bench --batch
  // fills one sequence and copies it).
  virtual void copy_from(const KVCache& other) = 0;
  // Device memory this cache holds (allocated for its whole capacity), in bytes.
  virtual size_t device_bytes() const = 0;

  void append(int64_t, const float*, const float*, int64_t) override {
    fail("device KV cache: append() is not used (Model::forward runs the step on the device)");
  }
  void attend(int64_t, const float*, int64_t, float*) override {
    fail("device KV cache: attend() is not used (Model::forward runs the step on the device)");
  }
};

}  // namespace ptllm
