// The CUDA backend against the CPU engine (label `cuda`: needs a GPU).
//
// Each case runs the same tokens through a CPU Decoder and a GPU one (prefill
// with every logit, then greedy decode on the CPU's choice) and compares every
// logit row: max |gpu - cpu| / max |cpu| <= tolerance. Weights stay as stored
// (fp32 fixtures fp32, bf16 models bf16) and all arithmetic is fp32 on both
// sides, so with an fp32 cache only summation order differs: 1e-4 (measured
// ~1e-6). A 16-bit cache rounds K/V that differ in the last fp32 bits, and a
// value next to a rounding boundary may land one 16-bit ulp apart: fp16
// (ulp 2^-11) 1e-3, bf16 (ulp 2^-8) 5e-3. Perplexity of the prefill through the
// cache: within 0.01% (relative 1e-4) for fp32 and fp16, 0.05% for bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>

#include "core/error.h"
#include "cuda/backend.h"
#include "engine/decoder.h"
#include "kv/cache_spec.h"
#include "model/model.h"
#include "test_util.h"

namespace ptllm {
namespace {
using namespace ptllm::test;

std::unique_ptr<Model> load(const std::string& path) {
  if (path.ends_with(".tinygpt")) {
    std::string tok;
    return Model::load_tinygpt(path, &tok);
  }
  return Model::load_hf(path);
}

double rel_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

// Sum of -log p(next token) over logits rows [n, V] for ids[1..n].
double nll(const std::vector<float>& logits, const std::vector<int32_t>& ids, int64_t V) {
  double s = 0;
  for (size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* r = logits.data() + t * size_t(V);
    double m = r[0];
    for (int64_t i = 1; i < V; ++i) m = std::max(m, double(r[i]));
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(double(r[i]) - m);
    s += -(double(r[ids[t + 1]]) - m - std::log(z));
  }
  return s;
}

struct RunOut {
  std::vector<float> prefill;              // [n, V]
  std::vector<std::vector<float>> steps;  // [vocab] per decode step
};

RunOut run(const Model& m, std::unique_ptr<KVCache> cache, const std::vector<int32_t>& ids,
           const std::vector<int32_t>& decode) {
  const int64_t V = m.config().vocab_size;
  Decoder d(m, std::move(cache));
  RunOut o;
  o.prefill.resize(ids.size() * size_t(V));
  d.prefill(ids, [&](int64_t first, int64_t n, const float* lg) {
    std::copy_n(lg, n * V, o.prefill.data() + first * V);
  });
  for (int32_t id : decode) o.steps.push_back(d.step(id));
  return o;
}

void compare_model(const std::string& path, int64_t n_prefill, int64_t n_decode) {
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not here";
  auto m = load(path);
  const int64_t V = m->config().vocab_size;
  std::mt19937 rng(7);
  std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
  const int64_t cap = n_prefill + n_decode;
  struct Mode {
    CacheSpec spec;
    double tol, ppl_tol;
  };
  const Mode modes[] = {
      {cache_spec(KVStorage::F32), 1e-4, 1e-4},
      {cache_spec(KVStorage::F16), 1e-3, 1e-4},
      {cache_spec(KVStorage::BF16), 5e-3, 5e-4},
      {cache_spec(KVStorage::F16, 4, 12), 1e-3, 1e-4},                     // StreamingLLM, re-positioned
      {cache_spec(KVStorage::F32, 2, 9, RopeMode::Absolute), 1e-4, 1e-4},  // StreamingLLM, absolute
  };
  for (const Mode& md : modes) {
    SCOPED_TRACE(path + " · " + md.spec.label());
    const RunOut cpu = run(*m, make_cache(m->cache_shape(cap), md.spec), ids, dec);
    cuda::activate(*m);
    std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), md.spec);
    cuda::deactivate();
    EXPECT_NE(gc->describe().find("GPU"), std::string::npos);
    const RunOut gpu = run(*m, std::move(gc), ids, dec);
    double worst = 0;
    for (int64_t t = 0; t < n_prefill; ++t)
      worst = std::max(worst, rel_err(gpu.prefill.data() + t * V, cpu.prefill.data() + t * V, V));
    for (size_t s = 0; s < cpu.steps.size(); ++s)
      worst = std::max(worst, rel_err(gpu.steps[s].data(), cpu.steps[s].data(), V));
    EXPECT_LE(worst, md.tol);
    const double pc = std::exp(nll(cpu.prefill, ids, V) / double(n_prefill - 1));
    const double pg = std::exp(nll(gpu.prefill, ids, V) / double(n_prefill - 1));
    EXPECT_LE(std::fabs(pg / pc - 1), md.ppl_tol) << "perplexity cpu " << pc << " gpu " << pg;
    std::printf("%s · %s: max rel logit err %.2e, ppl cpu %.6f gpu %.6f\n", path.c_str(), md.spec.label().c_str(),
                worst, pc, pg);
  }
}

TEST(CudaBackend, LlamaGqaTied) { compare_model(fixture("hf/llama-gqa-tied"), 37, 25); }
TEST(CudaBackend, LlamaMhaUntied) { compare_model(fixture("hf/llama-mha-untied"), 37, 25); }
TEST(CudaBackend, Llama3RopeScalingHeaddim) { compare_model(fixture("hf/llama3-rope-scaling-headdim"), 37, 25); }
TEST(CudaBackend, Qwen2QkvBias) { compare_model(fixture("hf/qwen2-qkv-bias"), 37, 25); }
// Its sliding window is 24: the cache must not be longer.
TEST(CudaBackend, MistralWithinWindow) { compare_model(fixture("hf/mistral-sliding-window"), 14, 10); }
TEST(CudaBackend, TinyGptPlain) { compare_model(fixture("tinygpt/tiny-plain.tinygpt"), 37, 25); }
// A real trained model (llama2.c stories260K, fp32).
TEST(CudaBackend, Stories260K) { compare_model(shared_dir() + "/models/stories260K", 120, 40); }
TEST(CudaBackend, Flagship27m) {
  const char* dir = std::getenv("PTLLM_FLAGSHIP");
  compare_model(dir ? dir : shared_dir() + "/models/flagship-27m", 300, 40);
}

// forward_batch over sequences at different positions and cache settings
// matches each sequence stepped alone on the CPU.
TEST(CudaBackend, BatchMatchesCpu) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  const int64_t V = m->config().vocab_size;
  const CacheSpec specs[] = {cache_spec(KVStorage::F16), cache_spec(KVStorage::F32), cache_spec(KVStorage::F16, 2, 6)};
  std::vector<std::unique_ptr<Decoder>> cpu, gpu;
  for (int b = 0; b < 3; ++b) {
    std::vector<int32_t> p(size_t(3 + 4 * b));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 31 + size_t(b) * 7) % size_t(V));
    cpu.push_back(std::make_unique<Decoder>(*m, make_cache(m->cache_shape(64), specs[b])));
    cpu.back()->prefill(p);
    cuda::activate(*m);
    gpu.push_back(std::make_unique<Decoder>(*m, make_cache(m->cache_shape(64), specs[b])));
    cuda::deactivate();
    gpu.back()->prefill(p);
  }
  for (int step = 0; step < 12; ++step) {
    std::vector<int32_t> ids = {int32_t(step % V), int32_t((step * 5 + 1) % V), int32_t((step * 11 + 2) % V)};
    std::vector<Decoder*> pc, pg;
    for (int b = 0; b < 3; ++b) {
      pc.push_back(cpu[size_t(b)].get());
      pg.push_back(gpu[size_t(b)].get());
    }
    step_batch(pc, ids);
    step_batch(pg, ids);
    for (int b = 0; b < 3; ++b)
      EXPECT_LE(rel_err(pg[size_t(b)]->logits().data(), pc[size_t(b)]->logits().data(), V), 1e-3)
          << "step " << step << " seq " << b;
  }
}

TEST(CudaBackend, UnsupportedCacheIsAClearError) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  cuda::activate(*m);
  try {
    (void)make_cache(m->cache_shape(16), cache_spec(KVStorage::Int4));
    ADD_FAILURE() << "int4 on the GPU should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int4"), std::string::npos) << e.what();
  }
  cuda::deactivate();
}

}  // namespace
}  // namespace ptllm
