// The engine behind the scheduler: a loaded model, one KVCache + Sampler per sequence.
#pragma once
#include <memory>

#include "engine/session.h"
#include "serve/backend.h"

namespace ptllm::serve {

// `lm` must outlive the backend.
std::unique_ptr<Backend> make_engine_backend(const LoadedModel& lm);

// Bytes (payload + scales) a cache of `o` for `model` holds when full, found by
// filling a throwaway cache: an unbounded one to the context length, a bounded
// one past sink + window + the KIVI residual (where its size stops changing).
size_t full_cache_bytes(const Model& model, const CacheSpec& o);

}  // namespace ptllm::serve
