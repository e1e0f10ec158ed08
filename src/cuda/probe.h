// For tests (tests/cuda): one layer of a GPU KV cache driven directly, with no
// model and no weights, so that the GPU cache (bookkeeping, append, grouped
// KIVI quantisation, attention) can be compared with the CPU's StorageKVCache
// on bit-identical inputs. Only in CUDA builds (backend.cc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kv/cache_spec.h"

namespace ptllm::cuda::testing {

// The KIVI decode kernel's plan (cuda/kernels.h kivi_dec_plan) forced for the
// next launches, so that one test run covers each kernel kind and splits of one
// and of several tiles; a value < 0 keeps the plan's (or the environment's)
// choice. KiviDecodeOverride{} (all -1) restores the defaults.
struct KiviDecodeOverride {
  int kind = -1, tiles_per_split = -1;
};
void set_kivi_decode(const KiviDecodeOverride& o);

// Decode steps run as a CUDA graph since the process started (backend.cc, Engine::run):
// `captured` steps recorded a graph (a new one or an update of the last), `replayed` ones
// launched the last graph as it was, `direct` ones launched their kernels one by one
// (graphs off, a prefill, a cuBLAS batch, a KIVI group flush). A test reads these to know
// which path its steps took.
struct GraphCounts {
  int64_t captured = 0, replayed = 0, direct = 0;
};
GraphCounts graph_counts();
// Steps (Engine::run calls) since the process started whose RMSNorms were folded into
// the GEMVs after them (PTLLM_CUDA_NORM_FOLD=1: one-row steps with 2-byte weights).
int64_t norm_folded_steps();

class LayerProbe {
 public:
  // shape.n_layers must be 1; shape.capacity as make_cache would set it
  // (sink + window for a StreamingLLM spec). Refuses what the GPU cache refuses.
  LayerProbe(const KVCacheShape& shape, const CacheSpec& spec);
  ~LayerProbe();
  // What a model's layer does with its cache in one step of n tokens: KVCache::append
  // of k, v [n, kvh, hd] (keys before RoPE, as the model hands them to the cache),
  // attend of q [n, nh, hd] (before RoPE) into out [n, nh, hd], then advance(n).
  void step(const float* k, const float* v, const float* q, int64_t n, float* out);
  // The decode attention alone: step() of one token (k, v, q) first, then `reps`
  // back-to-back launches of the attention that step ran for its query (split
  // kernel + combine), timed with CUDA events; returns seconds per launch.
  // flush_bytes > 0: before each launch a memset of that many scratch bytes evicts
  // the cache from L2 (the H200's is 50 MB), and each launch is timed alone.
  double time_attention(const float* k, const float* v, const float* q, int reps, size_t flush_bytes = 0);
  size_t payload_bytes() const;
  size_t scale_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ptllm::cuda::testing
