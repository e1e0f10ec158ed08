// The decode API (engine/decoder.h): chunked prefill, single steps, and
// step_batch over independent sequences through Model::forward_batch.
//
// Batch invariance is exact: a sequence's logits stepped in a batch of 16 are
// compared with EXPECT_EQ (bit for bit) against the same sequence stepped
// alone, at every SIMD level, for an fp32 cache and an int4 StreamingLLM cache
// that evicts during the test, on stories260K (f32 and f16 weights, GQA),
// flagship-27m (bf16), the YOCO fixture (a shared global K/V layer) and the
// Qwen2 fixture (q/k/v biases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "engine/bench.h"
#include "engine/decoder.h"
#include "engine/session.h"
#include "model/convert.h"
#include "ops/ops.h"
#include "test_util.h"

namespace ptllm {
namespace {

constexpr int kBatch = 16;
constexpr int kSteps = 12;

CacheSpec fp32_spec() { return CacheSpec{}; }
CacheSpec int4_streaming_spec() {
  CacheSpec s;
  s.storage = KVStorage::Int4;
  s.sink = 2;
  s.window = 14;  // prompts of up to 20 tokens + 12 steps: evicts on the way
  s.kivi_group = 4;
  s.kivi_residual = 8;
  return s;
}

// Sequence b: a prompt of 3 + b % 7 pseudo-random ids, and the ids it is fed
// afterwards (fixed, so a sequence sees the same tokens alone and batched).
std::vector<int32_t> ids_for(int b, int64_t n, int64_t vocab, uint32_t salt) {
  std::vector<int32_t> ids;
  uint32_t x = 2654435761u * uint32_t(b + 1) + salt;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    ids.push_back(int32_t(1 + (x >> 8) % uint32_t(vocab - 1)));
  }
  return ids;
}

std::unique_ptr<Decoder> start(const Model& m, const CacheSpec& spec, int b) {
  auto d = std::make_unique<Decoder>(m, make_model_cache(m, spec, 64));
  d->prefill(ids_for(b, 3 + b % 7, m.config().vocab_size, 7));
  return d;
}

// Steps every sequence alone and all of them batched; the logits must agree bit for bit.
void expect_batch_invariant(const Model& m, const CacheSpec& spec) {
  const int64_t V = m.config().vocab_size;
  std::vector<std::vector<std::vector<float>>> alone(kBatch);  // [b][step] -> logits
  for (int b = 0; b < kBatch; ++b) {
    auto d = start(m, spec, b);
    for (int32_t id : ids_for(b, kSteps, V, 99)) alone[size_t(b)].push_back(d->step(id));
  }
  std::vector<std::unique_ptr<Decoder>> seqs;
  std::vector<Decoder*> ptrs;
  for (int b = 0; b < kBatch; ++b) {
    seqs.push_back(start(m, spec, b));
    ptrs.push_back(seqs.back().get());
  }
  for (int t = 0; t < kSteps; ++t) {
    std::vector<int32_t> ids;
    for (int b = 0; b < kBatch; ++b) ids.push_back(ids_for(b, kSteps, V, 99)[size_t(t)]);
    step_batch(ptrs, ids);
    for (int b = 0; b < kBatch; ++b) {
      const std::vector<float>& got = seqs[size_t(b)]->logits();
      const std::vector<float>& want = alone[size_t(b)][size_t(t)];
      ASSERT_EQ(got.size(), size_t(V));
      int64_t diff = 0;
      for (int64_t i = 0; i < V; ++i) diff += got[size_t(i)] != want[size_t(i)];
      EXPECT_EQ(diff, 0) << "sequence " << b << " step " << t << ": " << diff << " logits differ, first "
                         << got[0] << " vs " << want[0];
    }
  }
  for (int b = 0; b < kBatch; ++b) {
    EXPECT_EQ(seqs[size_t(b)]->cache().position(), 3 + b % 7 + kSteps);
    EXPECT_EQ(seqs[size_t(b)]->timing().decode_tokens, kSteps);
  }
  if (spec.streaming()) {  // the bound really evicted
    EXPECT_EQ(seqs.back()->cache().stored(0), spec.sink + spec.window);
  }
}

void for_each_level(const std::function<void()>& fn) {
  const ops::SimdLevel keep = ops::simd_level();
  for (auto level : {ops::SimdLevel::Scalar, ops::SimdLevel::Avx2, ops::SimdLevel::Avx512}) {
    if (int(level) > int(ops::best_simd_level())) continue;
    SCOPED_TRACE(std::string(ops::simd_level_name(level)));
    ops::set_simd_level(level);
    for (int threads : {1, 2}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      ops::set_num_threads(threads);
      fn();
    }
  }
  ops::set_simd_level(keep);
  ops::set_num_threads(1);
}

TEST(BatchInvariance, Stories260K) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  for_each_level([&] {
    expect_batch_invariant(*m, fp32_spec());
    expect_batch_invariant(*m, int4_streaming_spec());
  });
}

// f16 weights: on AVX2 the n-row product of ops::matmul_multi widens a row to
// fp32 and reduces it in another order than the one-row dot (so a batch
// through it would differ); matmul_rows must not.
TEST(BatchInvariance, Stories260KF16) {
  // This process's own folder: ctest runs BatchInvariance.* in several processes
  // at once (tests/engine/CMakeLists.txt), and a file rewritten while another
  // process maps it is a SIGBUS there.
  const std::string path = test::tmp_path("batch_stories_f16.tinygpt");
  convert_hf_to_tinygpt(test::repo_dir() + "/models/stories260K", path, DType::F16);
  auto m = Model::load_tinygpt(path, nullptr);
  for_each_level([&] {
    expect_batch_invariant(*m, fp32_spec());
    expect_batch_invariant(*m, int4_streaming_spec());
  });
  std::filesystem::remove(path);
}

TEST(BatchInvariance, Flagship27mBf16) {
  auto m = Model::load_hf(test::repo_dir() + "/models/flagship-27m");
  ops::set_num_threads(1);
  expect_batch_invariant(*m, fp32_spec());
  expect_batch_invariant(*m, int4_streaming_spec());
}

TEST(BatchInvariance, YocoFixture) {
  auto m = Model::load_tinygpt(test::fixture("tinygpt/tiny-yoco.tinygpt"), nullptr);
  for_each_level([&] {
    expect_batch_invariant(*m, fp32_spec());
    expect_batch_invariant(*m, int4_streaming_spec());
  });
}

TEST(BatchInvariance, QkvBiasFixture) {
  auto m = Model::load_hf(test::fixture("hf/qwen2-qkv-bias"));
  for_each_level([&] { expect_batch_invariant(*m, int4_streaming_spec()); });
}

// Model::forward_prompts: 16 prompts of 1..16 tokens in one pass against each prompt
// in a pass of its own, bit for bit (its logits and, through the cache it filled, the
// logits of 4 decode steps after it), at every SIMD level and thread count. Against
// forward() (the CLI's prefill) within 1e-5 of the largest logit: the same products
// to rounding (forward() may order a product's sums differently).
void expect_prompts_invariant(const Model& m, const CacheSpec& spec) {
  const int64_t V = m.config().vocab_size;
  constexpr int kSteps = 4;
  std::vector<std::vector<int32_t>> prompts;
  for (int b = 0; b < kBatch; ++b) prompts.push_back(ids_for(b, 1 + b % 16, V, 5));
  const auto steps_after = [&](KVCache& c, int b) {
    std::vector<float> out;
    std::vector<float> lg(static_cast<size_t>(V));
    for (int32_t id : ids_for(b, kSteps, V, 77)) {
      m.forward(&id, 1, c, lg.data(), false);
      out.insert(out.end(), lg.begin(), lg.end());
    }
    return out;
  };
  std::vector<std::vector<float>> alone_logits, alone_steps, plain_logits;
  for (int b = 0; b < kBatch; ++b) {
    auto c = make_model_cache(m, spec, 64);
    KVCache* cp = c.get();
    const int64_t n = int64_t(prompts[size_t(b)].size());
    std::vector<float> lg(static_cast<size_t>(V));
    m.forward_prompts(prompts[size_t(b)].data(), &n, 1, &cp, lg.data());
    alone_logits.push_back(lg);
    alone_steps.push_back(steps_after(*c, b));
    auto f = make_model_cache(m, spec, 64);
    m.forward(prompts[size_t(b)].data(), n, *f, lg.data(), false);
    plain_logits.push_back(lg);
  }
  std::vector<std::unique_ptr<KVCache>> caches;
  std::vector<KVCache*> ptrs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> counts;
  for (int b = 0; b < kBatch; ++b) {
    caches.push_back(make_model_cache(m, spec, 64));
    ptrs.push_back(caches.back().get());
    tokens.insert(tokens.end(), prompts[size_t(b)].begin(), prompts[size_t(b)].end());
    counts.push_back(int64_t(prompts[size_t(b)].size()));
  }
  std::vector<float> together(size_t(kBatch * V));
  m.forward_prompts(tokens.data(), counts.data(), kBatch, ptrs.data(), together.data());
  for (int b = 0; b < kBatch; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const float* got = together.data() + size_t(b) * size_t(V);
    EXPECT_TRUE(std::equal(got, got + V, alone_logits[size_t(b)].begin())) << "prompt logits";
    EXPECT_EQ(steps_after(*caches[size_t(b)], b), alone_steps[size_t(b)]) << "decode steps after the prompt";
    EXPECT_EQ(caches[size_t(b)]->position(), counts[size_t(b)] + kSteps);
    float top = 0, diff = 0;
    for (int64_t i = 0; i < V; ++i) {
      top = std::max(top, std::fabs(plain_logits[size_t(b)][size_t(i)]));
      diff = std::max(diff, std::fabs(got[i] - plain_logits[size_t(b)][size_t(i)]));
    }
    EXPECT_LE(diff, 1e-5f * top) << "against forward()";
  }
}

TEST(PromptsInOnePass, Stories260K) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  for_each_level([&] {
    expect_prompts_invariant(*m, fp32_spec());
    expect_prompts_invariant(*m, int4_streaming_spec());
  });
}

TEST(PromptsInOnePass, Flagship27mBf16) {
  auto m = Model::load_hf(test::repo_dir() + "/models/flagship-27m");
  ops::set_num_threads(2);
  expect_prompts_invariant(*m, fp32_spec());
  ops::set_num_threads(1);
}

TEST(PromptsInOnePass, YocoAndQkvBiasFixtures) {
  auto yoco = Model::load_tinygpt(test::fixture("tinygpt/tiny-yoco.tinygpt"), nullptr);
  auto qwen = Model::load_hf(test::fixture("hf/qwen2-qkv-bias"));
  for_each_level([&] {
    expect_prompts_invariant(*yoco, fp32_spec());
    expect_prompts_invariant(*qwen, int4_streaming_spec());
  });
}

TEST(PromptsInOnePass, RejectsEmptyOversizedAndSharedCaches) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  auto a = make_model_cache(*m, CacheSpec{}, 4), b = make_model_cache(*m, CacheSpec{}, 4);
  KVCache* two[] = {a.get(), b.get()};
  KVCache* same[] = {a.get(), a.get()};
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  std::vector<float> lg(size_t(2 * m->config().vocab_size));
  const int64_t empty[] = {0, 2}, too_many[] = {5, 0}, ok[] = {3, 2}, outside[] = {1, 1};
  const std::vector<int32_t> bad = {1, 100000};
  const auto message = [&](const int32_t* t, const int64_t* c, KVCache* const* cs) {
    try {
      m->forward_prompts(t, c, 2, cs, lg.data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(tokens.data(), empty, two).find("sequence 0 has 0 tokens"), std::string::npos);
  EXPECT_NE(message(tokens.data(), too_many, two).find("has room for 4"), std::string::npos);
  EXPECT_NE(message(tokens.data(), ok, same).find("share one cache"), std::string::npos);
  EXPECT_NE(message(bad.data(), outside, two).find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(message(tokens.data(), ok, two), "no error");
  EXPECT_EQ(a->position(), 3);
  EXPECT_EQ(b->position(), 2);
}

TEST(StepBatch, RejectsSharedOrFullCachesAndMismatchedIds) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  Decoder a(*m, make_model_cache(*m, CacheSpec{}, 4)), b(*m, make_model_cache(*m, CacheSpec{}, 4));
  a.prefill(std::vector<int32_t>{1, 2});
  b.prefill(std::vector<int32_t>{1});
  std::vector<Decoder*> two = {&a, &b}, same = {&a, &a};
  EXPECT_THROW(step_batch(two, std::vector<int32_t>{3}), Error);
  EXPECT_THROW(step_batch(same, std::vector<int32_t>{3, 4}), Error);
  EXPECT_THROW(step_batch(two, std::vector<int32_t>{3, 100000}), Error);  // outside the vocabulary
  step_batch(two, std::vector<int32_t>{3, 4});
  step_batch(two, std::vector<int32_t>{5, 6});  // a is now full (4 tokens)
  EXPECT_FALSE(a.can_step());
  EXPECT_THROW(step_batch(two, std::vector<int32_t>{7, 8}), Error);
  EXPECT_THROW(a.step(7), Error);
  EXPECT_EQ(b.cache().position(), 3);
}

// prefill feeds a bounded cache in chunks it can take and hands every token's
// logits over once; the last chunk's last row is logits().
TEST(Decoder, PrefillChunksToTheCacheAndReportsEveryToken) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  ops::set_num_threads(1);
  CacheSpec spec;
  spec.sink = 2;
  spec.window = 6;
  Decoder d(*m, make_model_cache(*m, spec, 64));
  const int64_t V = m->config().vocab_size;
  const auto ids = ids_for(0, 30, V, 5);
  std::vector<int64_t> firsts;
  int64_t seen = 0;
  std::vector<float> last;
  d.prefill(ids, [&](int64_t first, int64_t n, const float* logits) {
    EXPECT_EQ(first, seen);
    EXPECT_LE(n, 8);  // never more than the cache's 8 slots
    firsts.push_back(first);
    seen += n;
    last.assign(logits + (n - 1) * V, logits + n * V);
  });
  EXPECT_EQ(seen, 30);
  EXPECT_GT(firsts.size(), 1u);
  EXPECT_EQ(last, d.logits());
  EXPECT_EQ(d.cache().position(), 30);
  EXPECT_EQ(d.cache().stored(0), 8);
  EXPECT_EQ(d.timing().prefill_tokens, 30);
  // The same ids without the callback give the same last logits (same chunks, same path).
  Decoder e(*m, make_model_cache(*m, spec, 64));
  e.prefill(ids);
  EXPECT_EQ(e.logits(), d.logits());
  // An unbounded cache that cannot hold the prompt, and an empty prompt, are errors.
  Decoder small(*m, make_model_cache(*m, CacheSpec{}, 4));
  EXPECT_THROW(small.prefill(ids), Error);
  EXPECT_THROW(small.prefill(std::vector<int32_t>{}), Error);
}

// step_bytes: every weight but the untied embedding table (one row of it), plus the cache.
TEST(Decoder, StepBytesAreWeightsPlusCache) {
  auto m = Model::load_hf(test::repo_dir() + "/models/flagship-27m");
  const TensorView& e = m->tensors().get("model.embed_tokens.weight");
  EXPECT_EQ(m->step_weight_bytes(), m->weight_bytes() - e.nbytes() + storage_bytes(e.dtype, size_t(e.cols())));
  Decoder d(*m, make_model_cache(*m, CacheSpec{}, 8));
  d.prefill(std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(d.step_bytes(), m->step_weight_bytes() + d.cache().payload_bytes());
  // Tied embeddings: the table is the output head, read whole.
  auto tied = Model::load_hf(test::fixture("hf/llama-gqa-tied"));
  EXPECT_EQ(tied->step_weight_bytes(), tied->weight_bytes());
}

// bench --batch on the CPU: B caches prefilled to the depth, each repeat decodes on from
// where the previous one stopped (warm-up included), B tokens counted per step.
TEST(Bench, BatchDecodesEverySequenceFromTheDepth) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  const auto& c = m->config();
  BenchOptions o;
  o.prompt_tokens = 0;
  o.gen_tokens = 5;
  o.repeat = 2;
  o.depth = 7;
  o.batch = 3;
  const BenchResult r = run_bench(*m, CacheSpec{}, o);
  EXPECT_EQ(r.decode_tps.size(), 2u);
  EXPECT_EQ(r.batch, 3);
  EXPECT_EQ(r.batch_fill, "prefill");
  EXPECT_EQ(r.device_bytes, 0u);
  // An fp32 cache holds depth + gen per run (3 runs: the warm-up and 2 repeats) per sequence.
  const size_t per_token = 2 * size_t(c.n_layers * c.n_kv_heads * c.head_dim) * 4;
  EXPECT_EQ(r.cache_bytes, per_token * size_t(7 + 5 * 3));
  EXPECT_EQ(r.batch_cache_bytes, 3 * r.cache_bytes);
  EXPECT_EQ(r.capacity, 7 + 5 * 3);
  // One time per timed batch step (the warm-up's steps not kept), each inside its repeat's.
  ASSERT_EQ(r.step_seconds.size(), 2u * 5u);
  double sum = 0;
  for (double t : r.step_seconds) EXPECT_GT(t, 0), sum += t;
  EXPECT_LE(sum, 2 * 5 * 3 / r.decode_tps[0] + 2 * 5 * 3 / r.decode_tps[1]);
  o.batch = 0;
  EXPECT_THROW(run_bench(*m, CacheSpec{}, o), Error);
  o.batch = 2;
  o.gen_tokens = 0;
  o.prompt_tokens = 4;
  EXPECT_THROW(run_bench(*m, CacheSpec{}, o), Error);
}

// Nearest-rank quantiles of the bench's step times: rank ceil(q n) of the sorted times.
TEST(Bench, StepQuantilesAreNearestRank) {
  std::vector<double> t;
  for (int i = 100; i >= 1; --i) t.push_back(i * 1e-3);  // 1 .. 100 ms, out of order
  t.push_back(0.5);                                      // one 500 ms step: 101 in all
  const StepQuantiles q = step_quantiles(t);
  EXPECT_EQ(q.steps, 101);
  EXPECT_DOUBLE_EQ(q.p50, 51e-3);  // rank ceil(50.5) = 51
  EXPECT_DOUBLE_EQ(q.p90, 91e-3);  // rank ceil(90.9) = 91
  EXPECT_DOUBLE_EQ(q.p99, 100e-3);  // rank ceil(99.99) = 100
  EXPECT_DOUBLE_EQ(q.max, 0.5);
  EXPECT_EQ(q.over_2x_median, 1);  // above 2 x 51 ms: the 500 ms step alone
  const StepQuantiles one = step_quantiles({2e-3});
  EXPECT_EQ(one.steps, 1);
  EXPECT_DOUBLE_EQ(one.p50, 2e-3);
  EXPECT_DOUBLE_EQ(one.p99, 2e-3);
  EXPECT_EQ(one.over_2x_median, 0);
  EXPECT_EQ(step_quantiles({}).steps, 0);
}

// bench on one sequence keeps every timed step's time: gen_tokens per repeat.
TEST(Bench, KeepsEachTimedStep) {
  auto m = Model::load_hf(test::repo_dir() + "/models/stories260K");
  BenchOptions o;
  o.prompt_tokens = 0;
  o.gen_tokens = 6;
  o.repeat = 3;
  const BenchResult r = run_bench(*m, CacheSpec{}, o);
  ASSERT_EQ(r.step_seconds.size(), 18u);
  const StepQuantiles q = step_quantiles(r.step_seconds);
  EXPECT_GT(q.p50, 0);
  EXPECT_LE(q.p50, q.p90);
  EXPECT_LE(q.p99, q.max);
}

}  // namespace
}  // namespace ptllm
