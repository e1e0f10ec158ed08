#include "engine/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "core/error.h"
#include "engine/decoder.h"
#include "engine/process.h"
#include "model/device_cache.h"

namespace ptllm {
namespace {

using Clock = std::chrono::steady_clock;

// n deterministic pseudo-random ids, avoiding the first few (special) ids.
std::vector<int32_t> bench_ids(const ModelConfig& cfg, int64_t n) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int32_t> pick(std::min<int32_t>(3, cfg.vocab_size - 1), cfg.vocab_size - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = pick(rng);
  return ids;
}

// The untimed fill: ids[0, depth) in chunks of at most 512 (or one token per
// step once a bounded cache is full).
void fill(Decoder& d, const std::vector<int32_t>& ids, int64_t depth) {
  if (depth > 0) d.prefill(std::span(ids.data(), size_t(depth)), {}, 512);
}

// Wall and CPU seconds of fn().
template <typename Fn>
std::pair<double, double> timed(Fn&& fn) {
  const auto t0 = Clock::now();
  const double c0 = process_cpu_seconds();
  fn();
  return {std::chrono::duration<double>(Clock::now() - t0).count(), process_cpu_seconds() - c0};
}

}  // namespace

StepQuantiles step_quantiles(std::vector<double> v) {
  StepQuantiles q;
  q.steps = int64_t(v.size());
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  const auto at = [&](double f) {
    const auto rank = static_cast<size_t>(std::ceil(f * double(v.size())));
    return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
  };
  q.p50 = at(0.5), q.p90 = at(0.9), q.p99 = at(0.99), q.max = v.back();
  q.over_2x_median = int64_t(v.end() - std::upper_bound(v.begin(), v.end(), 2 * q.p50));
  return q;
}

MeanSd mean_sd(const std::vector<double>& v) {
  MeanSd s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / double(v.size() - 1));
  }
  return s;
}

BenchResult run_bench(const Model& model, const CacheSpec& spec, const BenchOptions& o) {
  if (o.prompt_tokens < 0) fail("--prompt-tokens {}: expected >= 0", o.prompt_tokens);
  if (o.gen_tokens < 0) fail("--gen-tokens {}: expected >= 0", o.gen_tokens);
  if (o.repeat < 1) fail("--repeat {}: expected >= 1", o.repeat);
  if (o.depth < 0) fail("--depth {}: expected >= 0", o.depth);
  if (o.prompt_tokens == 0 && o.gen_tokens == 0) fail("--prompt-tokens and --gen-tokens are both 0: nothing to time");
  if (o.batch < 1 || o.batch > 4096) fail("--batch {}: expected 1 .. 4096", o.batch);
  if (o.batch > 1 && o.gen_tokens == 0) fail("--batch {}: needs --gen-tokens >= 1 (it batches the decode test)", o.batch);
  const int64_t runs = o.repeat + (o.warmup ? 1 : 0);
  const int64_t fill_to = std::max(o.prompt_tokens, o.depth);
  const std::vector<int32_t> ids =
      bench_ids(model.config(), fill_to + o.gen_tokens * (o.batch > 1 ? runs : 1) + o.batch + 1);
  BenchResult r;
  r.step_seconds.reserve(size_t(o.gen_tokens * o.repeat));  // no allocation inside a timed loop
  // One step's wall time into r.step_seconds when `keep` (a timed repeat).
  const auto step_timed = [&](bool keep, auto&& step) {
    const auto t0 = Clock::now();
    step();
    if (keep) r.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  // An unbounded cache must hold the prefill, or the fill plus the decode.
  r.capacity = std::max<int64_t>({o.prompt_tokens, o.depth + o.gen_tokens * (o.batch > 1 ? runs : 1), 1});
  r.step_weight_bytes = model.step_weight_bytes();
  r.batch = o.batch;
  std::vector<std::unique_ptr<Decoder>> seqs;
  std::vector<Decoder*> ptrs;
  if (o.batch > 1) {
    for (int64_t b = 0; b < o.batch; ++b) {
      seqs.push_back(std::make_unique<Decoder>(model, make_cache(model.cache_shape(r.capacity), spec)));
      ptrs.push_back(seqs.back().get());
    }
    fill(*seqs[0], ids, o.depth);
    r.batch_fill = "prefill";
    for (int64_t b = 1; b < o.batch; ++b) {
      if (auto* dc = dynamic_cast<DeviceKVCache*>(&seqs[size_t(b)]->cache())) {
        dc->copy_from(seqs[0]->cache());
        r.batch_fill = "device copy of the first sequence's cache";
      } else {
        fill(*seqs[size_t(b)], ids, o.depth);
      }
    }
  }
  // One prefill cache for every repeat, cleared in between, as llama-bench
  // clears its context's cache: a fresh cache per repeat put its first-touch
  // page faults inside the timed prefill (flagship-27m pp512: ~8% of the
  // profile in the cache append, another ~8% in the kernel).
  std::unique_ptr<Decoder> pre;
  if (o.prompt_tokens > 0) pre = std::make_unique<Decoder>(model, make_cache(model.cache_shape(r.capacity), spec));
  for (int64_t rep = 0; rep < runs; ++rep) {
    const bool keep = !o.warmup || rep > 0;
    if (o.prompt_tokens > 0) {
      Decoder& d = *pre;
      d.cache().clear();
      const auto [s, cs] = timed([&] { d.prefill(std::span(ids.data(), size_t(o.prompt_tokens))); });
      if (keep) {
        r.prefill_tps.push_back(double(o.prompt_tokens) / s);
        r.prefill_cpu_tps.push_back(double(o.prompt_tokens) / cs);
      }
    }
    if (o.gen_tokens > 0 && o.batch > 1) {
      // Sequence b takes the id b places on from sequence 0's (the ids only have to be valid).
      const int64_t at = o.depth + rep * o.gen_tokens;
      std::vector<int32_t> step_ids(size_t(o.batch));
      const auto [s, cs] = timed([&] {
        for (int64_t i = 0; i < o.gen_tokens; ++i) {
          for (int64_t b = 0; b < o.batch; ++b) step_ids[size_t(b)] = ids[size_t(at + i + b)];
          step_timed(keep, [&] { step_batch(ptrs, step_ids); });
        }
      });
      if (keep) {
        r.decode_tps.push_back(double(o.gen_tokens * o.batch) / s);
        r.decode_cpu_tps.push_back(double(o.gen_tokens * o.batch) / cs);
      }
      if (auto* dc = dynamic_cast<const DeviceKVCache*>(&seqs[0]->cache())) r.device_bytes = dc->device_bytes();
      r.cache_description = seqs[0]->cache().describe();
      r.cache_bytes = seqs[0]->cache().payload_bytes() + seqs[0]->cache().scale_bytes();
      r.batch_cache_bytes = 0;
      for (const auto& d : seqs) r.batch_cache_bytes += d->cache().payload_bytes() + d->cache().scale_bytes();
    } else if (o.gen_tokens > 0) {
      Decoder d(model, make_cache(model.cache_shape(r.capacity), spec));
      fill(d, ids, o.depth);
      const auto [s, cs] = timed([&] {
        for (int64_t i = 0; i < o.gen_tokens; ++i) step_timed(keep, [&] { d.step(ids[size_t(o.depth + i)]); });
      });
      if (keep) {
        r.decode_tps.push_back(double(o.gen_tokens) / s);
        r.decode_cpu_tps.push_back(double(o.gen_tokens) / cs);
      }
      if (auto* dc = dynamic_cast<const DeviceKVCache*>(&d.cache())) r.device_bytes = dc->device_bytes();
      r.cache_description = d.cache().describe();
      r.cache_bytes = d.cache().payload_bytes() + d.cache().scale_bytes();
    }
  }
  return r;
}

std::vector<InterleavedDepth> run_interleaved(const Model& model, const CacheSpec& spec,
                                              const std::vector<int64_t>& depths, int64_t gen, int64_t repeat) {
  if (gen < 1) fail("--interleave-depths needs --gen-tokens >= 1");
  if (repeat < 1) fail("--repeat {}: expected >= 1", repeat);
  int64_t max_depth = 0;
  for (int64_t d : depths) {
    if (d < 0) fail("--interleave-depths {}: expected depths >= 0", d);
    max_depth = std::max(max_depth, d);
  }
  const int64_t total = gen * (repeat + 1);  // one untimed warm-up round
  const std::vector<int32_t> ids = bench_ids(model.config(), max_depth + total);
  std::vector<Decoder> decoders;
  decoders.reserve(depths.size());
  for (int64_t d : depths) {
    decoders.emplace_back(model, make_cache(model.cache_shape(std::max<int64_t>(d + total, 1)), spec));
    fill(decoders.back(), ids, d);
  }
  std::vector<InterleavedDepth> out(depths.size());
  for (int64_t r = 0; r <= repeat; ++r)
    for (size_t k = 0; k < depths.size(); ++k) {
      const int64_t at = depths[k] + r * gen;
      const auto [s, cs] = timed([&] {
        for (int64_t i = 0; i < gen; ++i) decoders[k].step(ids[size_t(at + i)]);
      });
      if (r > 0) out[k].tps.push_back(double(gen) / s);
    }
  for (size_t k = 0; k < depths.size(); ++k) {
    const CacheState st = cache_state(decoders[k].cache());
    out[k].depth = depths[k];
    out[k].stored_at_end = st.stored.empty() ? 0 : st.stored[0];
    out[k].cache_bytes_at_end = st.bytes();
  }
  return out;
}

}  // namespace ptllm
