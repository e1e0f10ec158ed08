// Throughput of the decode loop, llama-bench style (the `bench` command).
//
// Each repeat times one prefill of prompt_tokens into one cache, cleared
// between repeats as llama-bench clears its context's cache (so the cache's
// first-touch page faults are not timed), then times gen_tokens single-token
// steps on a fresh cache. With depth D the steps are timed after
// the cache already holds D tokens (the fill itself is not timed), so decode
// speed at a given context is visible. Tokens are deterministic pseudo-random
// ids: speed does not depend on them. One untimed warm-up repeat comes first
// unless !warmup (page faults of the mmapped weights, cache warm-up).
//
// Batch B > 1: the decode test steps B sequences together (step_batch, one
// Model::forward_batch per step), each with its own cache at depth D. The caches
// are filled untimed: the first by prefill, the others as device-side copies of it
// when the caches live on a device (DeviceKVCache::copy_from), else by the same
// prefill each. One set of caches serves every repeat (repeat r decodes on from
// where r - 1 stopped: depth D + r * gen_tokens at its start); tokens/s counts
// B tokens per step.
//
// Interleaved: one cache per depth, each filled untimed to its depth; then
// `repeat` rounds in which every cache in turn decodes gen_tokens timed
// tokens. Alternating the caches within one process cancels the drift of a
// shared machine, which a 1k-vs-100k comparison of separate runs cannot.
//
// Every timed decode step's own wall time is kept too (step_seconds), so the tail
// of the step time -- what a served stream's inter-token p99 cannot go below -- is
// visible apart from the mean: StepQuantiles.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kv/cache_spec.h"
#include "model/model.h"

namespace ptllm {

struct MeanSd {
  double mean = 0, sd = 0;  // sample standard deviation
};
MeanSd mean_sd(const std::vector<double>& v);

struct BenchOptions {
  int64_t prompt_tokens = 512, gen_tokens = 128, repeat = 5, depth = 0, batch = 1;
  bool warmup = true;
};

struct BenchResult {
  // Tokens per wall-second and per CPU-second of each timed repeat: on a
  // shared machine a single-threaded run's CPU rate is what an idle core gives.
  std::vector<double> prefill_tps, prefill_cpu_tps, decode_tps, decode_cpu_tps;
  std::string cache_description;  // of the decode cache, at the end
  size_t cache_bytes = 0;         // held by the decode cache at the end
  size_t step_weight_bytes = 0;   // weights one decode step reads (Model::step_weight_bytes)
  int64_t capacity = 0;           // tokens an unbounded cache was sized for
  int64_t batch = 1;              // sequences per decode step
  size_t batch_cache_bytes = 0;   // held by all B decode caches at the end
  std::string batch_fill;         // how caches 2..B were filled ("device copy" or "prefill")
  size_t device_bytes = 0;        // device memory one decode cache holds (device caches; else 0)
  // Wall seconds of each timed decode step (one token, or one token per sequence of a
  // batch), the repeats' steps in order.
  std::vector<double> step_seconds;
};

// Nearest-rank quantiles of step times (q = 0.5: the median; the rank ceil(q n)).
struct StepQuantiles {
  int64_t steps = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
  // Steps longer than twice the median: on an idle machine, how often something else
  // took the cores (a descheduled thread, an interrupt storm, the hypervisor).
  int64_t over_2x_median = 0;
};
StepQuantiles step_quantiles(std::vector<double> seconds);
// Throws Error naming the option on bad values.
BenchResult run_bench(const Model& model, const CacheSpec& spec, const BenchOptions& o);

struct InterleavedDepth {
  int64_t depth = 0;
  std::vector<double> tps;  // one per timed round
  int64_t stored_at_end = 0;
  size_t cache_bytes_at_end = 0;
};
std::vector<InterleavedDepth> run_interleaved(const Model& model, const CacheSpec& spec,
                                              const std::vector<int64_t>& depths, int64_t gen, int64_t repeat);

}  // namespace ptllm
