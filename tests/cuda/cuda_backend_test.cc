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
//
// Grouped KIVI (int8 / int4 / int2). KiviLayerMatchesCpuExactly feeds one
// layer's GPU and CPU caches the same fp32 K/V/Q and requires the attention
// outputs to agree to 2e-5: the GPU quantises with the CPU's exact arithmetic
// (fp16 zero rounded down, scale up, the scale floor, round-half-up codes), so
// codes and parameters are identical there. Through a whole model the K/V that
// reach the cache differ in their last fp32 bits (GEMV summation order), and
// quantisation is a step function of them: where a value lies next to an fp16
// rounding boundary of the residual row it is quantised from (or is its group's
// min/max), a code can land one level apart -- one int4 level is 1/15 of the
// channel's range, a large jump next to the ~1e-7 input difference. Measured on
// the H200 (2026-12-01) over the fixture families and stories260K on random
// tokens, the worst logit / perplexity differences were int8 8.6e-4 / 4.2e-5,
// int4 5.7e-3 / 5.5e-4, int2 2.0e-4 / 1.9e-5 (fewer, wider levels: a
// boundary is rarely near), bf16 residual 3.7e-3 / 8.7e-4 (its ulp, 2^-8, moves
// residual values far more often, as for the bf16 cache). Tolerances, logits /
// perplexity: int8 2e-3 / 0.01%, int2 2e-3 / 0.01%, int4 1e-2 / 0.1%, bf16
// residual 1e-2 / 0.2%. stories260K on random tokens (perplexity ~4.5e7, every
// prediction confidently wrong) is where the int4 figures come from; on real
// text through the CLI the GPU's perplexity is within 0.01% of the CPU's
// (docs/CUDA.md). Each KIVI case also checks that it tests the codes: the CPU's
// KIVI logits differ from its fp16-cache logits by at least 10x (int8, nearly
// lossless: 2x) the GPU/CPU difference, and the GPU cache reports the CPU's
// payload and scale bytes (the same tokens quantised, held in full precision
// and evicted).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/backend.h"
#include "cuda/device_buffer.h"
#include "cuda/gemm.h"
#include "cuda/probe.h"
#include "engine/decoder.h"
#include "kv/cache_spec.h"
#include "model/device_cache.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/random_model.h"
#include "ops/ops.h"
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
           const std::vector<int32_t>& decode, size_t* bytes = nullptr) {
  const int64_t V = m.config().vocab_size;
  Decoder d(m, std::move(cache));
  RunOut o;
  o.prefill.resize(ids.size() * size_t(V));
  d.prefill(ids, [&](int64_t first, int64_t n, const float* lg) {
    std::copy_n(lg, n * V, o.prefill.data() + first * V);
  });
  for (int32_t id : decode) o.steps.push_back(d.step(id));
  if (bytes) {
    bytes[0] = d.cache().payload_bytes();
    bytes[1] = d.cache().scale_bytes();
  }
  return o;
}

// Worst relative logit error of b against a over the prefill rows and the decode steps.
double worst_err(const RunOut& b, const RunOut& a, int64_t n_prefill, int64_t V) {
  double worst = 0;
  for (int64_t t = 0; t < n_prefill; ++t)
    worst = std::max(worst, rel_err(b.prefill.data() + t * V, a.prefill.data() + t * V, V));
  for (size_t s = 0; s < a.steps.size(); ++s) worst = std::max(worst, rel_err(b.steps[s].data(), a.steps[s].data(), V));
  return worst;
}

CacheSpec with_residual(CacheSpec s, KVStorage r) {
  s.residual_dtype = r;
  return s;
}

struct Mode {
  CacheSpec spec;
  double tol, ppl_tol;
};

// The plain modes, and grouped KIVI with small groups so that the short runs
// quantise many groups (G4 R8: of 62 tokens all but the newest 8..11 are codes)
// and the StreamingLLM ones evict through codes (sliced groups) and residual.
std::vector<Mode> all_modes(int64_t G, int64_t R) {
  const int64_t W = R + 2 * G + 2;
  std::vector<Mode> m = {
      {cache_spec(KVStorage::F32), 1e-4, 1e-4},
      {cache_spec(KVStorage::F16), 1e-3, 1e-4},
      {cache_spec(KVStorage::BF16), 5e-3, 5e-4},
      {cache_spec(KVStorage::F16, 4, 12), 1e-3, 1e-4},                     // StreamingLLM, re-positioned
      {cache_spec(KVStorage::F32, 2, 9, RopeMode::Absolute), 1e-4, 1e-4},  // StreamingLLM, absolute
  };
  for (KVStorage q : {KVStorage::Int8, KVStorage::Int4, KVStorage::Int2}) {
    // See the top of the file for why int4 is looser.
    const double tol = q == KVStorage::Int4 ? 1e-2 : 2e-3, ppl = q == KVStorage::Int4 ? 1e-3 : 1e-4;
    m.push_back({cache_spec(q, 0, 0, RopeMode::Reposition, G, R), tol, ppl});
    // Window R + 2G + 2 (18 for G4 R8) is not a multiple of G: groups are sliced by the
    // one-token slide. (4 + 18 slots: within Mistral's sliding window of 24.)
    m.push_back({cache_spec(q, 4, W, RopeMode::Reposition, G, R), tol, ppl});
  }
  m.push_back({cache_spec(KVStorage::Int4, 2, R + G + 5, RopeMode::Absolute, G, R), 1e-2, 1e-3});
  // Residual rows and sinks stored fp32 (int4's tolerances) and bf16 (one bf16 ulp, 2^-8).
  m.push_back({with_residual(cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, G, R), KVStorage::F32), 1e-2,
               1e-3});
  m.push_back({with_residual(cache_spec(KVStorage::Int8, 4, W, RopeMode::Reposition, G, R), KVStorage::BF16), 1e-2,
               2e-3});
  return m;
}

void compare_model(const std::string& path, int64_t n_prefill, int64_t n_decode, int64_t G = 4, int64_t R = 8) {
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not here";
  auto m = load(path);
  const int64_t V = m->config().vocab_size;
  std::mt19937 rng(7);
  std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
  const int64_t cap = n_prefill + n_decode;
  for (const Mode& md : all_modes(G, R)) {
    const std::string label = md.spec.label();
    SCOPED_TRACE(path + " · " + label);
    size_t cb[2], gb[2];
    const RunOut cpu = run(*m, make_cache(m->cache_shape(cap), md.spec), ids, dec, cb);
    cuda::activate(*m);
    std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), md.spec);
    cuda::deactivate();
    EXPECT_NE(gc->describe().find("GPU"), std::string::npos);
    const RunOut gpu = run(*m, std::move(gc), ids, dec, gb);
    const double worst = worst_err(gpu, cpu, n_prefill, V);
    const auto ppl = [&](const RunOut& r) { return std::exp(nll(r.prefill, ids, V) / double(n_prefill - 1)); };
    const double pc = ppl(cpu), pg = ppl(gpu);
    // A quantised cache turns a last-bit difference in K or V into a code one level apart,
    // and the model carries it on. On flagship-27m (300 tokens, G4 R8) the CPU's own paths
    // differ from each other as much as the GPU differs from the CPU: scalar or AVX2 against
    // AVX-512, logits 3e-3 (int8), 3-4e-2 (int4), 1.0-1.4e-1 (int2), perplexity up to 8e-3
    // (int2), on random tokens and on real text alike (docs/CUDA.md, "Session 28"). So a
    // quantised mode's bounds are its stated tolerances or 3x the most that the CPU's other
    // SIMD levels differ from its own on the same tokens, whichever is larger; perplexity
    // also passes within a quarter of what quantising moves it (the CPU's KIVI against its
    // fp16 cache). A wrong code, scale or slot moves the logits by the quantisation's own
    // effect, which must stay at least 2x the GPU's difference.
    double spread = 0, ppl_spread = 0, effect = 0, ppl_effect = 0;
    RunOut ref;
    if (md.spec.quantised()) {
      const ops::SimdLevel best = ops::simd_level();
      for (ops::SimdLevel lv : {ops::SimdLevel::Scalar, ops::SimdLevel::Avx2, ops::SimdLevel::Neon}) {
        ops::set_simd_level(lv);
        if (ops::simd_level() == best || ops::simd_level() != lv) continue;  // not another level here
        const RunOut o = run(*m, make_cache(m->cache_shape(cap), md.spec), ids, dec);
        spread = std::max(spread, worst_err(o, cpu, n_prefill, V));
        ppl_spread = std::max(ppl_spread, std::fabs(ppl(o) / pc - 1));
      }
      ops::set_simd_level(best);
      CacheSpec plain = md.spec;
      plain.storage = KVStorage::F16;
      ref = run(*m, make_cache(m->cache_shape(cap), plain), ids, dec);
      effect = worst_err(cpu, ref, n_prefill, V);
      ppl_effect = std::fabs(pc / ppl(ref) - 1);
    }
    const double tol = std::max(md.tol, 3 * spread);
    const double ppl_tol = std::max({md.ppl_tol, 3 * ppl_spread, ppl_effect / 4});
    EXPECT_LE(worst, tol) << "CPU's other SIMD levels vs its own " << spread;
    EXPECT_LE(std::fabs(pg / pc - 1), ppl_tol) << "perplexity cpu " << pc << " gpu " << pg;
    std::string extra;
    if (md.spec.quantised()) {
      // The same tokens quantised / held full precision as on the CPU.
      EXPECT_EQ(gb[0], cb[0]) << "payload bytes";
      EXPECT_EQ(gb[1], cb[1]) << "scale bytes";
      EXPECT_GT(cb[1], 0u) << "nothing was quantised: the case does not test the codes";
      // Quantisation matters at this size: the KIVI logits are far from an fp16 cache's.
      EXPECT_GE(effect, 2 * worst) << "KIVI vs fp16 on the CPU " << effect << ", GPU vs CPU " << worst;
      extra = fmt::format(", KIVI vs fp16 cache {:.2e} / ppl {:.1e}, CPU's SIMD levels apart {:.2e} / ppl {:.1e}, "
                          "bytes {} + {} scales",
                          effect, ppl_effect, spread, ppl_spread, cb[0], cb[1]);
    }
    std::printf("%s · %s: max rel logit err %.2e (tol %.1e), ppl cpu %.6f gpu %.6f (rel %.1e, tol %.1e)%s\n",
                path.c_str(), label.c_str(), worst, tol, pc, pg, std::fabs(pg / pc - 1), ppl_tol,
                extra.c_str());
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
// The default-ish KIVI shape on a real model: G16 R32 over 160 tokens (8 groups).
TEST(CudaBackend, Stories260KGroup16) { compare_model(shared_dir() + "/models/stories260K", 120, 40, 16, 32); }
TEST(CudaBackend, Flagship27m) {
  const char* dir = std::getenv("PTLLM_FLAGSHIP");
  compare_model(dir ? dir : shared_dir() + "/models/flagship-27m", 300, 40);
}

// ---- One layer without a model: the GPU cache against the CPU's on identical inputs ----
//
// K, V and Q are the same fp32 numbers on both sides, so the fp16/bf16 residual
// rows are the same and the GPU's group quantisation must give the CPU's codes
// and parameters exactly; only the attention's fp32 summation order differs.
// Attention outputs must agree to 2e-5 (relative to the largest |out|): one code
// one level apart moves a score by q_i * scale (int8: ~1/255 of a channel's
// range) and shows as >= 1e-4, so this checks the quantisation bit for bit,
// through sliced groups, ring wrap-around and re-positioned RoPE. Inputs include
// a constant K channel (the scale floor, an fp16 subnormal scale) and V values
// past the fp16 range (saturated to 65504).
struct LayerCase {
  CacheSpec spec;
  int64_t kvh, nh, hd;
  std::vector<int64_t> chunks;  // tokens per step
  double tol;
};

void compare_layer(const LayerCase& lc) {
  SCOPED_TRACE(fmt::format("{} · kvh {} nh {} hd {}", lc.spec.label(), lc.kvh, lc.nh, lc.hd));
  int64_t total = 0;
  for (int64_t c : lc.chunks) total += c;
  KVCacheShape sh;
  sh.n_layers = 1;
  sh.n_heads = lc.nh;
  sh.n_kv_heads = lc.kvh;
  sh.head_dim = lc.hd;
  sh.capacity = lc.spec.streaming() ? lc.spec.sink + lc.spec.window : total;
  std::unique_ptr<KVCache> cpu = make_cache(sh, lc.spec);
  cuda::testing::LayerProbe gpu(sh, lc.spec);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t KD = lc.kvh * lc.hd, QD = lc.nh * lc.hd;
  double worst = 0;
  int64_t pos = 0;
  for (size_t ci = 0; ci < lc.chunks.size(); ++ci) {
    const int64_t n = lc.chunks[ci];
    std::vector<float> k(size_t(n * KD)), v(k.size()), q(size_t(n * QD)), oc(q.size()), og(q.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < KD; ++j) {
        const int64_t ch = j % lc.hd;
        // Channels of different spread; channel 3 constant (zero range: the scale floor).
        k[size_t(t * KD + j)] = ch == 3 ? 0.25f : nd(rng) * (1.f + float(ch % 5)) + 0.3f * float(ch % 3);
        v[size_t(t * KD + j)] = nd(rng) * (ch % 4 == 1 ? 3.f : 1.f);
      }
    if (ci == 1) v[0] = 7e4f;  // past the fp16 range: both sides store 65504
    for (auto& x : q) x = nd(rng) * 0.5f;
    cpu->append(0, k.data(), v.data(), n);
    cpu->attend(0, q.data(), n, oc.data());
    cpu->advance(n);
    gpu.step(k.data(), v.data(), q.data(), n, og.data());
    const double e = rel_err(og.data(), oc.data(), n * QD);
    worst = std::max(worst, e);
    ASSERT_LE(e, lc.tol) << "step " << ci << " (" << n << " tokens at position " << pos << ")";
    ASSERT_EQ(gpu.payload_bytes(), cpu->payload_bytes()) << "step " << ci;
    ASSERT_EQ(gpu.scale_bytes(), cpu->scale_bytes()) << "step " << ci;
    pos += n;
  }
  if (lc.spec.quantised()) {
    EXPECT_GT(cpu->scale_bytes(), 0u) << "nothing was quantised";
  }
  std::printf("layer %s · kvh %lld nh %lld hd %lld · %lld tokens: max rel err %.2e (tol %.0e), %zu + %zu bytes\n",
              lc.spec.label().c_str(), (long long)lc.kvh, (long long)lc.nh, (long long)lc.hd, (long long)total, worst,
              lc.tol, cpu->payload_bytes(), cpu->scale_bytes());
}

std::vector<int64_t> chunks(std::initializer_list<int64_t> head, int64_t ones) {
  std::vector<int64_t> c(head);
  c.insert(c.end(), size_t(ones), 1);
  return c;
}

TEST(CudaBackend, KiviLayerMatchesCpuExactly) {
  const auto R = RopeMode::Reposition, A = RopeMode::Absolute;
  std::vector<LayerCase> cases;
  for (KVStorage q : {KVStorage::Int8, KVStorage::Int4, KVStorage::Int2}) {
    cases.push_back({cache_spec(q, 0, 0, R, 4, 8), 2, 4, 64, chunks({37, 5}, 50), 2e-5});
    cases.push_back({cache_spec(q, 4, 18, R, 4, 8), 2, 4, 64, chunks({10}, 80), 2e-5});
    cases.push_back({cache_spec(q, 2, 17, A, 4, 8), 2, 4, 64, chunks({9}, 70), 2e-5});
    // The defaults (G32 R128) with a 252-token window: rings wrap, groups sliced.
    cases.push_back({cache_spec(q, 4, 252, R, 32, 128), 2, 8, 128, chunks({200}, 150), 2e-5});
  }
  // Long enough (>= 8 splits of 64 slots) for the decode kernel to share a block
  // among the 4 query heads of a KV head.
  cases.push_back({cache_spec(KVStorage::Int4, 0, 0, R, 32, 128), 2, 8, 64, chunks({520}, 40), 2e-5});
  cases.push_back({cache_spec(KVStorage::Int2, 4, 600, R, 32, 128), 2, 8, 64, chunks({560}, 60), 2e-5});
  // 8 query heads per KV head, head_dim 128, a window that wraps.
  cases.push_back({cache_spec(KVStorage::Int8, 4, 300, R, 16, 32), 1, 8, 128, chunks({280}, 50), 2e-5});
  // Rows whose codes do not fill the last byte (hd 6 int2, hd 10 int4), R = 0, G = 1.
  cases.push_back({cache_spec(KVStorage::Int2, 0, 0, R, 4, 8), 1, 2, 6, chunks({21}, 20), 2e-5});
  cases.push_back({cache_spec(KVStorage::Int4, 2, 13, R, 4, 4), 1, 1, 10, chunks({7}, 40), 2e-5});
  cases.push_back({cache_spec(KVStorage::Int4, 0, 0, R, 4, 0), 2, 2, 16, chunks({11, 3}, 30), 2e-5});
  cases.push_back({cache_spec(KVStorage::Int8, 3, 20, R, 1, 2), 2, 2, 16, chunks({6}, 40), 2e-5});
  // Residual rows and sinks fp32 and bf16.
  cases.push_back({with_residual(cache_spec(KVStorage::Int4, 4, 18, R, 4, 8), KVStorage::F32), 2, 4, 64,
                   chunks({10}, 60), 2e-5});
  cases.push_back({with_residual(cache_spec(KVStorage::Int2, 0, 0, R, 8, 16), KVStorage::BF16), 2, 4, 64,
                   chunks({30}, 50), 2e-5});
  // The probe itself on a plain cache: keys rotated by the GPU's RoPE kernel, so an
  // fp16 row can round one ulp apart (fp16 tolerance); fp32 is summation order only.
  cases.push_back({cache_spec(KVStorage::F16, 4, 18, R), 2, 4, 64, chunks({10}, 40), 1e-3});
  cases.push_back({cache_spec(KVStorage::F32, 2, 17, A), 2, 4, 64, chunks({9}, 40), 2e-5});
  // Every decode kernel: the tiled kernel with one tile per split (many splits) and
  // with three (the online softmax across tiles, copies of the next tile in flight,
  // a split ending mid-tile), and the session-7 kernel.
  using O = cuda::testing::KiviDecodeOverride;
  const std::pair<const char*, O> runs[] = {{"tiled, 1 tile per split", O{2, 1}},
                                            {"tiled, 3 tiles per split", O{2, 3}},
                                            {"session-7 kernel", O{1, -1}}};
  for (const auto& [what, o] : runs) {
    SCOPED_TRACE(what);
    cuda::testing::set_kivi_decode(o);
    for (const LayerCase& c : cases) compare_layer(c);
  }
  cuda::testing::set_kivi_decode(O{});
}

// One CPU and one GPU decoder per spec, each prefilled with its own prompt of
// 3 + prompt_step * b ids, then `steps` batch steps of ids(step, b) on both;
// every step's logits of each sequence within `tol` (relative). Returns the
// worst error; the decoders are left in `cpu` / `gpu` for further checks.
template <typename Ids>
double batch_vs_cpu(const Model& m, const std::vector<CacheSpec>& specs, size_t prompt_step, int steps, Ids ids_of,
                    double tol, std::vector<std::unique_ptr<Decoder>>& cpu, std::vector<std::unique_ptr<Decoder>>& gpu,
                    int64_t max_len = 64) {
  const int64_t V = m.config().vocab_size;
  const int B = int(specs.size());
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> p(3 + prompt_step * size_t(b));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 31 + size_t(b) * 7) % size_t(V));
    cpu.push_back(std::make_unique<Decoder>(m, make_cache(m.cache_shape(max_len), specs[size_t(b)])));
    cpu.back()->prefill(p);
    cuda::activate(m);
    gpu.push_back(std::make_unique<Decoder>(m, make_cache(m.cache_shape(max_len), specs[size_t(b)])));
    cuda::deactivate();
    gpu.back()->prefill(p);
  }
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> ids;
    std::vector<Decoder*> pc, pg;
    for (int b = 0; b < B; ++b) {
      ids.push_back(int32_t(ids_of(step, b) % V));
      pc.push_back(cpu[size_t(b)].get());
      pg.push_back(gpu[size_t(b)].get());
    }
    step_batch(pc, ids);
    step_batch(pg, ids);
    for (int b = 0; b < B; ++b) {
      const double e = rel_err(pg[size_t(b)]->logits().data(), pc[size_t(b)]->logits().data(), V);
      worst = std::max(worst, e);
      EXPECT_LE(e, tol) << "step " << step << " seq " << b;
    }
  }
  return worst;
}

// forward_batch over sequences at different positions and cache settings
// matches each sequence stepped alone on the CPU.
TEST(CudaBackend, BatchMatchesCpu) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  std::vector<std::unique_ptr<Decoder>> cpu, gpu;
  const int64_t mult[] = {1, 5, 11};
  batch_vs_cpu(*m, {cache_spec(KVStorage::F16), cache_spec(KVStorage::F32), cache_spec(KVStorage::F16, 2, 6)}, 4, 12,
               [&](int step, int b) { return step * mult[b] + b; }, 1e-3, cpu, gpu);
}

// What the GPU cache does not do is refused where the cache is made, with one
// line that names it.
TEST(CudaBackend, UnsupportedCacheIsAClearError) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  CacheSpec rot = cache_spec(KVStorage::Int4);
  rot.rotate = KVRotate::Hadamard;
  CacheSpec tok = cache_spec(KVStorage::Int4);
  tok.k_axis = KeyAxis::Token;
  CacheSpec mixed = cache_spec(KVStorage::Int4);
  mixed.value_storage = KVStorage::Int2;
  CacheSpec plain_rot = cache_spec(KVStorage::F16);
  plain_rot.rotate = KVRotate::Hadamard;
  const std::pair<CacheSpec, std::string> cases[] = {
      {cache_spec(KVStorage::Int3), "KV cache storage int3 is not on the GPU yet"},
      {cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0, 0), "simple KIVI scheme (--kivi-group 0)"},
      {rot, "--kv-rotate hadamard is not on the GPU yet"},
      {plain_rot, "--kv-rotate hadamard is not on the GPU yet"},
      {tok, "--kivi-k-axis token is not on the GPU yet"},
      {mixed, "K and V stored differently (K int4 / V int2)"},
  };
  cuda::activate(*m);
  for (const auto& [spec, want] : cases) {
    try {
      (void)make_cache(m->cache_shape(16), spec);
      ADD_FAILURE() << spec.label() << " on the GPU should be refused";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  // And what is supported is not: grouped int8/int4/int2, fp16/fp32/bf16 residual.
  for (KVStorage q : {KVStorage::Int8, KVStorage::Int4, KVStorage::Int2})
    EXPECT_NO_THROW((void)make_cache(m->cache_shape(16), cache_spec(q)));
  cuda::deactivate();
}

// forward_batch with KIVI caches of different widths and bounds next to a plain
// one, each sequence at its own position: matches each stepped on the CPU.
TEST(CudaBackend, BatchKiviMatchesCpu) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  const std::vector<CacheSpec> specs = {cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 4, 8),
                                        cache_spec(KVStorage::F16),
                                        cache_spec(KVStorage::Int2, 2, 13, RopeMode::Reposition, 4, 4),
                                        cache_spec(KVStorage::Int8, 2, 10, RopeMode::Absolute, 2, 4)};
  std::vector<std::unique_ptr<Decoder>> cpu, gpu;
  const double worst = batch_vs_cpu(*m, specs, 5, 30, [](int step, int b) { return step * (5 + 6 * b) + b; }, 2e-3,
                                    cpu, gpu);
  for (size_t b = 0; b < specs.size(); ++b) EXPECT_EQ(gpu[b]->cache().payload_bytes(), cpu[b]->cache().payload_bytes());
  std::printf("batch of 4 (int4, fp16, int2 sink 2 + window 13, int8 absolute): max rel logit err %.2e\n", worst);
}

// A random fp32 Llama with head_dim 64 and GQA 4 (8 query heads over 2 KV heads, 2
// layers, vocabulary 300): the shape the lanes-over-slots KIVI decode kernel takes
// (the fixtures' head_dim is 8-32), written to the temporary file `file`.
std::unique_ptr<Model> random_hd64_gqa4_model(const char* file, DType type = DType::F32) {
  RandomModelOptions opt;
  opt.config = random_model_preset("llama-3.2-1b");
  opt.config.hidden_size = 512, opt.config.n_layers = 2, opt.config.n_heads = 8, opt.config.n_kv_heads = 2;
  opt.config.head_dim = 64, opt.config.intermediate_size = 512, opt.config.vocab_size = 300;
  opt.type = type;
  opt.std = 0.05f;
  const std::string path = tmp_path(file);
  write_random_gguf(path, opt);
  return load_gguf_model(path);
}

// The batched launch of the lanes-over-slots KIVI decode kernel (head_dim 64 / 128
// only; the fixtures' head_dim is 8-32): a random fp32 Llama with head_dim 64 and
// GQA 4 (8 query heads over 2 KV heads), KIVI caches next to a plain one, each
// sequence at its own position, 40 batch steps (quantised groups, sinks and a
// sliding window); every step against the CPU. Tolerance 1e-2, compare_model's int4
// one: through a model the GPU's K/V differ from the CPU's in their last bits, so a
// code may land one level apart, and an int2 level is a third of a channel's range.
// Measured on the H200 (2026-12-02) with 2e-3 here: max 5.18e-3 (int2 sink + window,
// int4), the same value with the per-sequence launches (PTLLM_CUDA_BATCH_LAUNCH=0).
TEST(CudaBackend, BatchKiviHeadDim64MatchesCpu) {
  auto m = random_hd64_gqa4_model("cuda_kivi_hd64.gguf");
  const std::vector<CacheSpec> specs = {cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 4, 8),
                                        cache_spec(KVStorage::F16),
                                        cache_spec(KVStorage::Int2, 2, 13, RopeMode::Reposition, 4, 4),
                                        cache_spec(KVStorage::Int8, 2, 10, RopeMode::Absolute, 2, 4),
                                        cache_spec(KVStorage::Int4, 4, 21, RopeMode::Reposition, 8, 8)};
  std::vector<std::unique_ptr<Decoder>> cpu, gpu;
  const double worst = batch_vs_cpu(*m, specs, 5, 40, [](int step, int b) { return (step * (5 + 6 * b) + b) % 300; },
                                    1e-2, cpu, gpu);
  for (size_t b = 0; b < specs.size(); ++b) EXPECT_EQ(gpu[b]->cache().payload_bytes(), cpu[b]->cache().payload_bytes());
  std::printf("batch of 5 at head_dim 64, GQA 4 (int4, fp16, int2 sink + window, int8 absolute, int4 sink + window): "
              "max rel logit err %.2e\n",
              worst);
}

// The batched KIVI decode launch over int4 caches of groups 8 to 32 tokens, sequences of
// 3 to 627 tokens (one to five 128-slot splits of the lanes-over-slots kernel; a shorter
// sequence's splits past its end are empty), unbounded and sink + window, 24 steps
// against the CPU within 1e-2 (as BatchKiviHeadDim64MatchesCpu). Written in session 8
// for the two-slot kernel (removed in session 9, docs/CUDA.md); kept for the default
// kernel's multi-split batched launch. The device script also runs it with
// PTLLM_CUDA_KIVI_DEC=0 (the general kernel).
TEST(CudaBackend, BatchKiviLongSequencesMatchCpu) {
  auto m = random_hd64_gqa4_model("cuda_kivi_long.gguf");
  const std::vector<CacheSpec> specs = {cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 8, 16),
                                        cache_spec(KVStorage::Int4, 4, 300, RopeMode::Reposition, 32, 32),
                                        cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 16, 16),
                                        cache_spec(KVStorage::Int4, 2, 250, RopeMode::Absolute, 8, 8),
                                        cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, 128)};
  std::vector<std::unique_ptr<Decoder>> cpu, gpu;
  const double worst = batch_vs_cpu(*m, specs, 150, 24, [](int step, int b) { return (step * (7 + 4 * b) + b) % 300; },
                                    1e-2, cpu, gpu, 700);
  for (size_t b = 0; b < specs.size(); ++b) EXPECT_EQ(gpu[b]->cache().payload_bytes(), cpu[b]->cache().payload_bytes());
  std::printf("batch of 5 int4 caches (G 8-32, unbounded and sink + window, up to 627 tokens) at head_dim 64, GQA 4: "
              "max rel logit err %.2e\n",
              worst);
}

// One sequence's decode steps replay a captured CUDA graph (Engine::run; docs/CUDA.md,
// Session 23). 600 steps after a 20-token prefill cross the attention's one-split bound
// (256 slots: a combine launch appears, so a new graph) and 512 (an update in place), a
// StreamingLLM ring wraps (its start moves every step, in device memory), and KIVI groups
// flush (those steps launch directly). Per mode: graphs on against the CPU within the
// mode's tolerance (as compare_model), and against graphs off (PTLLM_CUDA_GRAPH=0: the
// kernels launched one by one, the one-sequence attention launch) within 1e-5 relative:
// the same arithmetic launched another way (expected equal; the margin is for the
// compiler contracting the two attention kernels' expressions differently). The
// counts show which path the steps took: without the replays this test would compare
// direct launches with themselves.
TEST(CudaBackend, DecodeGraphMatchesDirectLaunches) {
  auto m = random_hd64_gqa4_model("cuda_graph.gguf");
  const int64_t V = m->config().vocab_size, n_prefill = 20, n_decode = 600, cap = n_prefill + n_decode;
  std::mt19937 rng(11);
  std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
  const std::vector<Mode> modes = {
      {cache_spec(KVStorage::F16), 1e-3, 0},
      {cache_spec(KVStorage::F32, 4, 300), 1e-4, 0},
      {cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, 64), 1e-2, 0},
      {cache_spec(KVStorage::Int8, 4, 300, RopeMode::Reposition, 32, 32), 2e-3, 0},
  };
  for (const Mode& md : modes) {
    SCOPED_TRACE(md.spec.label());
    const RunOut cpu = run(*m, make_cache(m->cache_shape(cap), md.spec), ids, dec);
    int64_t replayed[2] = {}, captured[2] = {};
    const auto on_gpu = [&](bool graph) {
      setenv("PTLLM_CUDA_GRAPH", graph ? "1" : "0", 1);
      cuda::activate(*m);
      std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), md.spec);
      cuda::deactivate();
      const cuda::testing::GraphCounts before = cuda::testing::graph_counts();
      RunOut o = run(*m, std::move(gc), ids, dec);
      const cuda::testing::GraphCounts after = cuda::testing::graph_counts();
      replayed[graph] = after.replayed - before.replayed;
      captured[graph] = after.captured - before.captured;
      return o;
    };
    const RunOut on = on_gpu(true), off = on_gpu(false);
    unsetenv("PTLLM_CUDA_GRAPH");
    const double vs_cpu = worst_err(on, cpu, n_prefill, V), vs_off = worst_err(on, off, n_prefill, V);
    EXPECT_LE(vs_cpu, md.tol);
    EXPECT_LE(vs_off, 1e-5);
    // KIVI: one step in 32 flushes a group and goes direct; a new graph at 257 slots.
    EXPECT_GE(replayed[1], n_decode * 9 / 10);
    EXPECT_GE(captured[1], 1);
    EXPECT_EQ(replayed[0] + captured[0], 0);
    std::printf("%s: graphs on vs CPU %.2e (tol %.0e), vs graphs off %.2e; %lld steps replayed, %lld captured\n",
                md.spec.label().c_str(), vs_cpu, md.tol, vs_off, (long long)replayed[1], (long long)captured[1]);
  }
}

// PTLLM_CUDA_NORM_FOLD=1 (written in session 25 without a GPU): a bf16 model's decode steps
// with every RMSNorm folded into the GEMV after it, against the CPU (the cache modes'
// usual tolerances) and against the same steps with separate norm launches. Folding
// changes only fp32 rounding (inv_rms applied to the row's sum instead of to x), so
// folded vs not is held to 1e-4, ten times below the fp16 cache's tolerance; every
// decode step must have taken the folded path, and the prefill (several rows) not.
TEST(CudaBackend, NormFoldedDecodeMatchesCpu) {
  auto m = random_hd64_gqa4_model("cuda_fold.gguf", DType::BF16);
  const int64_t V = m->config().vocab_size, n_prefill = 20, n_decode = 100, cap = n_prefill + n_decode;
  std::mt19937 rng(17);
  std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
  const std::vector<Mode> modes = {
      {cache_spec(KVStorage::F16), 1e-3, 0},
      {cache_spec(KVStorage::F32, 4, 40), 1e-4, 0},
      {cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, 64), 1e-2, 0},
  };
  for (const Mode& md : modes) {
    SCOPED_TRACE(md.spec.label());
    const RunOut cpu = run(*m, make_cache(m->cache_shape(cap), md.spec), ids, dec);
    int64_t folded[2] = {};
    const auto on_gpu = [&](bool fold) {
      setenv("PTLLM_CUDA_NORM_FOLD", fold ? "1" : "0", 1);
      cuda::activate(*m);
      std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), md.spec);
      cuda::deactivate();
      const int64_t before = cuda::testing::norm_folded_steps();
      RunOut o = run(*m, std::move(gc), ids, dec);
      folded[fold] = cuda::testing::norm_folded_steps() - before;
      return o;
    };
    const RunOut on = on_gpu(true), off = on_gpu(false);
    unsetenv("PTLLM_CUDA_NORM_FOLD");
    const double vs_cpu = worst_err(on, cpu, n_prefill, V), vs_off = worst_err(on, off, n_prefill, V);
    EXPECT_LE(vs_cpu, md.tol);
    EXPECT_LE(vs_off, 1e-4);
    EXPECT_GT(vs_off, 0) << "folded and separate launches agree to the bit: was anything folded?";
    EXPECT_EQ(folded[1], n_decode) << "every decode step (one row) folded, the prefill not";
    EXPECT_EQ(folded[0], 0);
    std::printf("%s: norms folded vs CPU %.2e (tol %.0e), vs separate norms %.2e; %lld steps folded\n",
                md.spec.label().c_str(), vs_cpu, md.tol, vs_off, (long long)folded[1]);
  }
}

// PTLLM_CUDA_L2_PREFETCH=MB (session 25, written without a GPU): the one-row GEMVs end by
// prefetching the next GEMV's weights into L2, a hint that must change no result: the
// same decode steps with it (1 MB: part of each next matrix; 64 MB: all of each, larger
// than any here) and without are equal bit for bit, with the norms folded and not.
TEST(CudaBackend, L2PrefetchChangesNoResult) {
  auto m = random_hd64_gqa4_model("cuda_prefetch.gguf", DType::BF16);
  const int64_t V = m->config().vocab_size, n_prefill = 12, n_decode = 40, cap = n_prefill + n_decode;
  std::mt19937 rng(19);
  std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
  for (const char* fold : {"0", "1"}) {
    setenv("PTLLM_CUDA_NORM_FOLD", fold, 1);
    std::vector<RunOut> outs;
    for (const char* mb : {"0", "1", "64"}) {
      SCOPED_TRACE(fmt::format("fold {} prefetch {} MB", fold, mb));
      setenv("PTLLM_CUDA_L2_PREFETCH", mb, 1);
      cuda::activate(*m);
      std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), cache_spec(KVStorage::F16));
      cuda::deactivate();
      outs.push_back(run(*m, std::move(gc), ids, dec));
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      const RunOut& a = outs.front();
      const RunOut& b = outs.back();
      EXPECT_EQ(0, std::memcmp(a.prefill.data(), b.prefill.data(), a.prefill.size() * 4));
      for (size_t i = 0; i < a.steps.size(); ++i)
        ASSERT_EQ(0, std::memcmp(a.steps[i].data(), b.steps[i].data(), size_t(V) * 4)) << "step " << i;
    }
  }
  unsetenv("PTLLM_CUDA_NORM_FOLD");
  unsetenv("PTLLM_CUDA_L2_PREFETCH");
}

// A batch large enough for the batched paths at their defaults: projections of 16+
// rows through cuBLAS (fp32 weights here: an fp32 GEMM) and one attention launch
// per layer and storage kind for all sequences (four groups of six).
TEST(CudaBackend, BatchOfManyMatchesCpu) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  std::vector<CacheSpec> specs;
  for (int r = 0; r < 6; ++r) {
    specs.push_back(cache_spec(KVStorage::F16));
    specs.push_back(cache_spec(KVStorage::F32, 2, 6));
    specs.push_back(cache_spec(KVStorage::Int8, 0, 0, RopeMode::Reposition, 4, 8));
    specs.push_back(cache_spec(KVStorage::Int2, 2, 13, RopeMode::Reposition, 4, 4));
  }
  std::vector<std::unique_ptr<Decoder>> cpu, gpu;
  const double worst = batch_vs_cpu(*m, specs, 1, 14, [](int step, int b) { return step * (3 + 2 * b) + b; }, 2e-3,
                                    cpu, gpu);
  std::printf("batch of %zu (fp16, fp32 sink + window, int8, int2 sink + window), cuBLAS %s: max rel logit err %.2e\n",
              specs.size(), cuda::Gemm::get() ? "on" : ("off: " + cuda::Gemm::load_error()).c_str(), worst);
}

// A decode batch of 16+ sequences with bf16 weights goes through a bf16 GEMM (the
// activations rounded to bf16 first): each sequence's logits against the same
// sequence stepped alone on the GPU (GEMV kernel, fp32 activations, the same bf16
// weights). The rounding must show (the GEMM ran) and stay small.
TEST(CudaBackend, BatchBf16GemmMatchesSingleSteps) {
  if (!cuda::Gemm::get()) GTEST_SKIP() << "no cuBLAS: " << cuda::Gemm::load_error();
  auto m = load(fixture("hf/llama-gqa-tied"));
  const int64_t V = m->config().vocab_size;
  const int B = 20;
  if (const char* e = std::getenv("PTLLM_CUDA_GEMM_ROWS"); e && (std::atoi(e) <= 0 || std::atoi(e) > B))
    GTEST_SKIP() << "PTLLM_CUDA_GEMM_ROWS=" << e << ": a batch of " << B << " takes no GEMM";
  cuda::activate(*m, cuda::WeightType::BF16);
  std::vector<std::unique_ptr<Decoder>> batch, solo;
  for (int b = 0; b < B; ++b) {
    std::vector<int32_t> p(size_t(3 + b));
    for (size_t i = 0; i < p.size(); ++i) p[i] = int32_t((i * 37 + size_t(b) * 11) % size_t(V));
    for (auto* set : {&batch, &solo}) {
      set->push_back(std::make_unique<Decoder>(*m, make_cache(m->cache_shape(64), cache_spec(KVStorage::F16))));
      set->back()->prefill(p);
    }
  }
  cuda::deactivate();
  double worst = 0;
  for (int step = 0; step < 10; ++step) {
    std::vector<int32_t> ids;
    std::vector<Decoder*> pb;
    for (int b = 0; b < B; ++b) {
      ids.push_back(int32_t((step * (7 + b) + 3 * b) % V));
      pb.push_back(batch[size_t(b)].get());
    }
    step_batch(pb, ids);
    for (int b = 0; b < B; ++b) {
      solo[size_t(b)]->step(ids[size_t(b)]);
      const double e = rel_err(batch[size_t(b)]->logits().data(), solo[size_t(b)]->logits().data(), V);
      worst = std::max(worst, e);
      EXPECT_LE(e, 2e-2) << "step " << step << " seq " << b;
    }
  }
  EXPECT_GT(worst, 0.0) << "the batch did not take the bf16 GEMM";
  std::printf("batch of %d, bf16 weights: bf16 GEMM vs GEMV single steps, max rel logit diff %.2e\n", B, worst);
}

// The fused GEMV launches (q/k/v as segments of one launch, gate/up/silu as one) against the
// separate launches they replace, bit for bit: each output row's sum is the same sequence of
// operations when the launches split K the same way, which holds at these shapes (one row,
// 2-byte weights: gemv1p_kernel, or gemv1_kernel with PTLLM_CUDA_GEMV1=1, the same sums; more
// rows: K < 1,024 one warp per row, K >= 2,048 eight for every segment and the whole). K = 93
// takes the scalar loop, 2,056 a partial chunk.
// Also against a double-precision reference of the same weights, so that a fused launch that
// skipped or misplaced a segment cannot pass by matching a wrong separate one.
TEST(CudaBackend, FusedGemvMatchesSeparateLaunches) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (auto e : {cuda::k::Elem::F32, cuda::k::Elem::F16, cuda::k::Elem::BF16})
    for (int K : {93, 96, 2048, 2056})
      for (int M : {1, 3, 11}) {
        SCOPED_TRACE(fmt::format("elem {} K {} M {}", int(e), K, M));
        const int es = cuda::k::elem_bytes(e);
        // K = 96: 20,000 rows in segment 0, more than the row-walking kernel's resident warps, so
        // its warps take several rows each.
        const int N[3] = {K >= 2048 ? 256 : K == 96 ? 20000 : 70, K >= 2048 ? 64 : 24, K >= 2048 ? 64 : 24};
        std::vector<float> x(size_t(M * K));
        for (auto& v : x) v = nd(rng);
        cuda::DevBuf dx, dwf, dw[3], db[3], dy_sep[3], dy_fused[3];
        dx.reserve(x.size() * 4);
        cuda::check(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "copy");
        std::vector<std::vector<float>> w(3), bias(3), y0(3);
        for (int i = 0; i < 3; ++i) {
          w[size_t(i)].resize(size_t(N[i] * K));
          for (auto& v : w[size_t(i)]) v = nd(rng);
          bias[size_t(i)].resize(size_t(N[i]));
          for (auto& v : bias[size_t(i)]) v = nd(rng);
          y0[size_t(i)].resize(size_t(M * N[i]));
          for (auto& v : y0[size_t(i)]) v = nd(rng);
          // Weights in e (rounded on the device), read back so the reference sees the same values.
          dwf.reserve(w[size_t(i)].size() * 4);
          dw[i].reserve(w[size_t(i)].size() * size_t(es));
          cuda::check(cudaMemcpy(dwf.p, w[size_t(i)].data(), w[size_t(i)].size() * 4, cudaMemcpyHostToDevice), "copy");
          cuda::k::convert(dwf.f(), e, dw[i].p, int64_t(w[size_t(i)].size()), nullptr);
          // The GEMV kernels read their first weight chunk before waiting on the previous
          // launch (kernels.h): the weights must be complete before any GEMV is launched.
          cuda::check(cudaDeviceSynchronize(), "convert");
          db[i].reserve(bias[size_t(i)].size() * 4);
          cuda::check(cudaMemcpy(db[i].p, bias[size_t(i)].data(), bias[size_t(i)].size() * 4, cudaMemcpyHostToDevice),
                      "copy");
          for (auto* d : {&dy_sep[i], &dy_fused[i]}) {
            d->reserve(y0[size_t(i)].size() * 4);
            cuda::check(cudaMemcpy(d->p, y0[size_t(i)].data(), y0[size_t(i)].size() * 4, cudaMemcpyHostToDevice), "copy");
          }
        }
        // q with bias, k accumulating, v plain: every epilogue in one launch.
        const bool acc[3] = {false, true, false};
        const bool has_bias[3] = {true, false, false};
        cuda::k::GemvSegs segs;
        for (int i = 0; i < 3; ++i) {
          cuda::k::gemv(e, dw[i].p, dx.f(), has_bias[i] ? db[i].f() : nullptr, dy_sep[i].f(), M, N[i], K, acc[i],
                        nullptr);
          segs.o[i] = cuda::k::GemvOut{dw[i].p, has_bias[i] ? db[i].f() : nullptr, dy_fused[i].f(), N[i], acc[i]};
        }
        segs.n = 3;
        cuda::k::gemv_multi(e, segs, dx.f(), M, K, nullptr);
        // SwiGLU with q's weights as both gate and up (silu(a) * a), against its three launches.
        cuda::DevBuf dg, du, dglu;
        for (auto* d : {&dg, &du, &dglu}) d->reserve(size_t(M * N[0]) * 4);
        cuda::k::gemv(e, dw[0].p, dx.f(), nullptr, dg.f(), M, N[0], K, false, nullptr);
        cuda::k::gemv(e, dw[0].p, dx.f(), nullptr, du.f(), M, N[0], K, false, nullptr);
        cuda::k::silu_mul(dg.f(), du.f(), int64_t(M) * N[0], nullptr);
        cuda::k::gemv_swiglu(e, dw[0].p, dw[0].p, dx.f(), dglu.f(), M, N[0], K, nullptr);
        cuda::check(cudaDeviceSynchronize(), "sync");
        // The weights as the kernels see them (rounded to e).
        std::vector<float> wr(size_t(N[0] * K));
        {
          cuda::DevBuf back;
          back.reserve(wr.size() * 4);
          // Widened by an embedding lookup of every row (E = W0, ids 0..N0-1).
          std::vector<int32_t> ids(static_cast<size_t>(N[0]));
          for (int r = 0; r < N[0]; ++r) ids[size_t(r)] = r;
          cuda::DevBuf dids;
          dids.reserve(ids.size() * 4);
          cuda::check(cudaMemcpy(dids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "copy");
          cuda::k::embed(e, dw[0].p, static_cast<const int32_t*>(dids.p), N[0], K, back.f(), nullptr);
          cuda::check(cudaMemcpy(wr.data(), back.p, wr.size() * 4, cudaMemcpyDeviceToHost), "copy");
        }
        for (int i = 0; i < 3; ++i) {
          std::vector<float> a(y0[size_t(i)].size()), b(a.size());
          cuda::check(cudaMemcpy(a.data(), dy_sep[i].p, a.size() * 4, cudaMemcpyDeviceToHost), "copy");
          cuda::check(cudaMemcpy(b.data(), dy_fused[i].p, b.size() * 4, cudaMemcpyDeviceToHost), "copy");
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "segment " << i;
          if (i == 0) {  // against double precision (weights as the kernel read them)
            double worst = 0;
            for (int m = 0; m < M; ++m)
              for (int n = 0; n < N[0]; ++n) {
                double ref = bias[0][size_t(n)], mag = std::fabs(ref);
                for (int k = 0; k < K; ++k) {
                  ref += double(wr[size_t(n * K + k)]) * x[size_t(m * K + k)];
                  mag += std::fabs(double(wr[size_t(n * K + k)]) * x[size_t(m * K + k)]);
                }
                worst = std::max(worst, std::fabs(b[size_t(m * N[0] + n)] - ref) / mag);
              }
            EXPECT_LE(worst, 1e-6) << "fp32 sums of the widened weights";
          }
        }
        std::vector<float> a(size_t(M * N[0])), b(a.size());
        cuda::check(cudaMemcpy(a.data(), dg.p, a.size() * 4, cudaMemcpyDeviceToHost), "copy");
        cuda::check(cudaMemcpy(b.data(), dglu.p, b.size() * 4, cudaMemcpyDeviceToHost), "copy");
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "gemv_swiglu vs gemv, gemv, silu_mul";
      }
}

// The RMSNorm folded into the one-row GEMV kernels (k::GemvNorm) against the norm and the
// product launched apart, for the fused q/k/v launch (three segments, a bias), the SwiGLU
// launch and gemv_normed, at K that take the one-row kernels (96, 2048, 2056: one row
// per warp and rows walked by warps, below and above the resident warps) and K and M that
// do not (93: K % 8 != 0; M = 3; fp32 weights). Where a launch folds (gemv_folds_norm),
// the scratch rows must stay untouched (no norm launch) and segment 0 must match a
// double-precision reference of W (g * x) / rms(x) to 1e-6 of its terms' magnitude, as
// the unfolded kernel's sums do; elsewhere the launch normalises into the scratch first
// and its outputs equal the separate launches' bit for bit.
TEST(CudaBackend, NormFoldedGemvMatchesSeparateNorm) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const float eps = 1e-5f;
  for (auto e : {cuda::k::Elem::F32, cuda::k::Elem::F16, cuda::k::Elem::BF16})
    for (int K : {93, 96, 2048, 2056})
      for (int M : {1, 3}) {
        SCOPED_TRACE(fmt::format("elem {} K {} M {}", int(e), K, M));
        const int es = cuda::k::elem_bytes(e);
        const int N[3] = {K == 96 ? 20000 : K == 93 ? 70 : 256, 64, 40};
        std::vector<float> x(static_cast<size_t>(M * K)), g(static_cast<size_t>(K));
        for (auto& v : x) v = 3 * nd(rng);
        for (auto& v : g) v = 1 + 0.5f * nd(rng);
        cuda::DevBuf dx, dg, dxn, dscratch, dwf, dw[3], db, dy_sep[3], dy_fold[3], dglu[2], dlm[2];
        for (auto [d, h] : {std::pair{&dx, &x}, std::pair{&dg, &g}}) {
          d->reserve(h->size() * 4);
          cuda::check(cudaMemcpy(d->p, h->data(), h->size() * 4, cudaMemcpyHostToDevice), "copy");
        }
        dxn.reserve(x.size() * 4);
        dscratch.reserve(x.size() * 4);
        const std::vector<float> nan_rows(x.size(), std::nanf(""));
        cuda::check(cudaMemcpy(dscratch.p, nan_rows.data(), x.size() * 4, cudaMemcpyHostToDevice), "copy");
        std::vector<float> bias(static_cast<size_t>(N[0]));
        for (auto& v : bias) v = nd(rng);
        db.reserve(bias.size() * 4);
        cuda::check(cudaMemcpy(db.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), "copy");
        for (int i = 0; i < 3; ++i) {
          std::vector<float> w(size_t(N[i] * K));
          for (auto& v : w) v = nd(rng);
          dwf.reserve(w.size() * 4);
          dw[i].reserve(w.size() * size_t(es));
          cuda::check(cudaMemcpy(dwf.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice), "copy");
          cuda::k::convert(dwf.f(), e, dw[i].p, int64_t(w.size()), nullptr);
          cuda::check(cudaDeviceSynchronize(), "convert");  // weights complete before any GEMV (kernels.h)
          dy_sep[i].reserve(size_t(M * N[i]) * 4);
          dy_fold[i].reserve(size_t(M * N[i]) * 4);
        }
        for (auto* d : {&dglu[0], &dglu[1], &dlm[0], &dlm[1]}) d->reserve(size_t(M * N[0]) * 4);
        const cuda::k::GemvNorm norm{dg.f(), eps, dscratch.f()};
        cuda::k::GemvSegs sep, fold;
        for (int i = 0; i < 3; ++i) {
          sep.o[i] = cuda::k::GemvOut{dw[i].p, i == 0 ? db.f() : nullptr, dy_sep[i].f(), N[i], false};
          fold.o[i] = cuda::k::GemvOut{dw[i].p, i == 0 ? db.f() : nullptr, dy_fold[i].f(), N[i], false};
        }
        sep.n = fold.n = 3;
        fold.norm = norm;
        // Apart: the norm, then each product of the normalised rows.
        cuda::k::rmsnorm(dx.f(), dg.f(), eps, M, K, dxn.f(), nullptr);
        cuda::k::gemv_multi(e, sep, dxn.f(), M, K, nullptr);
        cuda::k::gemv_swiglu(e, dw[0].p, dw[0].p, dxn.f(), dglu[0].f(), M, N[0], K, nullptr);
        cuda::k::gemv(e, dw[0].p, dxn.f(), nullptr, dlm[0].f(), M, N[0], K, false, nullptr);
        // Folded where the launch can.
        const bool folds = cuda::k::gemv_folds_norm(e, M, K, dx.f());
        EXPECT_EQ(folds, e != cuda::k::Elem::F32 && M == 1 && K % 8 == 0);
        cuda::k::gemv_multi(e, fold, dx.f(), M, K, nullptr);
        cuda::k::gemv_swiglu(e, dw[0].p, dw[0].p, dx.f(), dglu[1].f(), M, N[0], K, nullptr, norm);
        cuda::k::gemv_normed(e, dw[0].p, dx.f(), norm, dlm[1].f(), M, N[0], K, nullptr);
        cuda::check(cudaDeviceSynchronize(), "sync");
        const auto host = [](const cuda::DevBuf& d, size_t n) {
          std::vector<float> h(n);
          cuda::check(cudaMemcpy(h.data(), d.p, n * 4, cudaMemcpyDeviceToHost), "copy");
          return h;
        };
        const std::vector<float> scratch = host(dscratch, x.size()), xn = host(dxn, x.size());
        if (folds) {
          for (float v : scratch) ASSERT_TRUE(std::isnan(v)) << "a folded launch wrote the scratch rows";
        } else {
          EXPECT_EQ(0, std::memcmp(scratch.data(), xn.data(), x.size() * 4)) << "scratch rows = rmsnorm(x)";
        }
        // The weights as the kernels see them (rounded to e), widened by an embedding lookup.
        std::vector<float> wr(size_t(N[0] * K));
        {
          std::vector<int32_t> ids(static_cast<size_t>(N[0]));
          for (int r = 0; r < N[0]; ++r) ids[size_t(r)] = r;
          cuda::DevBuf dids, back;
          dids.reserve(ids.size() * 4);
          back.reserve(wr.size() * 4);
          cuda::check(cudaMemcpy(dids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "copy");
          cuda::k::embed(e, dw[0].p, static_cast<const int32_t*>(dids.p), N[0], K, back.f(), nullptr);
          wr = host(back, wr.size());
        }
        // Segment 0 (with its bias), the SwiGLU (silu(v) v, v = W0 xn) and gemv_normed against double.
        const std::vector<float> q = host(dy_fold[0], size_t(M * N[0])), glu = host(dglu[1], size_t(M * N[0])),
                                 lm = host(dlm[1], size_t(M * N[0]));
        double worst = 0, worst_glu = 0;
        for (int m = 0; m < M; ++m) {
          double ss = 0;
          for (int k = 0; k < K; ++k) ss += double(x[size_t(m * K + k)]) * x[size_t(m * K + k)];
          const double inv = 1 / std::sqrt(ss / K + eps);
          for (int n = 0; n < N[0]; ++n) {
            double v = 0, mag = 0;
            for (int k = 0; k < K; ++k) {
              const double t = double(wr[size_t(n * K + k)]) * x[size_t(m * K + k)] * inv * g[size_t(k)];
              v += t;
              mag += std::fabs(t);
            }
            const size_t i = size_t(m * N[0] + n);
            worst = std::max({worst, std::fabs(q[i] - (v + bias[size_t(n)])) / (mag + std::fabs(bias[size_t(n)])),
                              std::fabs(lm[i] - v) / mag});
            // d(silu(v) v)/dv is at most ~2.2 |v| + 1: the error of v, scaled.
            const double ref = v / (1 + std::exp(-v)) * v;
            worst_glu = std::max(worst_glu, std::fabs(glu[i] - ref) / (mag * (2.2 * std::fabs(v) + 1)));
          }
        }
        EXPECT_LE(worst, 1e-6) << "fp32 sums of the widened weights, normalised rows";
        EXPECT_LE(worst_glu, 1e-6) << "SwiGLU of the normalised rows";
        for (int i = 0; i < 3; ++i) {
          const std::vector<float> a = host(dy_sep[i], size_t(M * N[i])), b = host(dy_fold[i], size_t(M * N[i]));
          if (!folds) {
            EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "segment " << i;
          }
        }
        if (!folds) {
          EXPECT_EQ(0, std::memcmp(host(dglu[0], glu.size()).data(), glu.data(), glu.size() * 4)) << "SwiGLU";
          EXPECT_EQ(0, std::memcmp(host(dlm[0], lm.size()).data(), lm.data(), lm.size() * 4)) << "gemv_normed";
        }
      }
}

// bf16 RNE on the host (the GEMM's input rounding), for the reference below.
float bf16_round(float x, uint16_t* bits) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  *bits = uint16_t(u >> 16);
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// cuBLAS's y (+)= x W^T with bf16 W against a double-precision reference of the same
// bf16-rounded inputs: the layout (row-major nn.Linear weight, transposes) and the
// accumulate flag.
TEST(CudaBackend, GemmBf16MatchesReference) {
  cuda::Gemm* g = cuda::Gemm::get();
  if (!g) GTEST_SKIP() << "no cuBLAS: " << cuda::Gemm::load_error();
  const int M = 37, N = 70, K = 96;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(M * K)), wr(size_t(N * K)), xr(size_t(M * K)), y0(size_t(M * N));
  std::vector<uint16_t> wb(size_t(N * K)), scratch(1);
  for (size_t i = 0; i < wr.size(); ++i) wr[i] = bf16_round(nd(rng), &wb[i]);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = nd(rng);
    xr[i] = bf16_round(x[i], &scratch[0]);
  }
  for (auto& v : y0) v = nd(rng);
  cuda::DevBuf dw, dx, dxb, dy;
  dw.reserve(wb.size() * 2);
  dx.reserve(x.size() * 4);
  dxb.reserve(x.size() * 2);
  dy.reserve(y0.size() * 4);
  cuda::check(cudaMemcpy(dw.p, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice), "copy");
  cuda::check(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "copy");
  for (bool acc : {false, true}) {
    cuda::check(cudaMemcpy(dy.p, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice), "copy");
    g->run(cuda::k::Elem::BF16, dw.p, dx.f(), dxb.p, dy.f(), M, N, K, acc, nullptr);
    std::vector<float> y(y0.size());
    cuda::check(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost), "copy");
    double worst = 0;
    for (int i = 0; i < M; ++i)
      for (int n = 0; n < N; ++n) {
        double ref = acc ? y0[size_t(i * N + n)] : 0.0, mag = std::fabs(ref);
        for (int k = 0; k < K; ++k) {
          ref += double(xr[size_t(i * K + k)]) * wr[size_t(n * K + k)];
          mag += std::fabs(double(xr[size_t(i * K + k)]) * wr[size_t(n * K + k)]);
        }
        worst = std::max(worst, std::fabs(y[size_t(i * N + n)] - ref) / mag);
      }
    EXPECT_LE(worst, 1e-6) << "accumulate " << acc;  // fp32 accumulation of exact bf16 products
  }
}

// Session 26: a GGUF model stored in bf16 (weights uploaded as bf16, so its decode steps
// take the one-row GEMV kernels, gemv1_kernel / gemv1p_kernel) against the CPU, per
// prefill row and per decode step, and an fp32 copy of the same shape (the multi-row
// kernel) beside it. No earlier test ran those kernels end to end against the CPU except
// Flagship27m, which the device's lite shared folder leaves out; session 26's first device
// run failed NormFoldedDecodeMatchesCpu and L2PrefetchChangesNoResult on this model. The
// CPU multiplies the same bf16 weights in fp32, so the fp16 cache's tolerance holds. Three
// GPU runs, each against the CPU, so a run-to-run difference shows as well.
TEST(CudaBackend, Bf16ModelOneRowDecodeMatchesCpu) {
  for (DType dt : {DType::BF16, DType::F32}) {
    const char* name = dt == DType::BF16 ? "bf16" : "f32";
    SCOPED_TRACE(name);
    auto m = random_hd64_gqa4_model(dt == DType::BF16 ? "cuda_onerow_bf16.gguf" : "cuda_onerow_f32.gguf", dt);
    const int64_t V = m->config().vocab_size, n_prefill = 12, n_decode = 8, cap = n_prefill + n_decode;
    std::mt19937 rng(19);
    std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
    for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
    for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
    const RunOut cpu = run(*m, make_cache(m->cache_shape(cap), cache_spec(KVStorage::F16)), ids, dec);
    for (int r = 0; r < 3; ++r) {
      cuda::activate(*m);
      std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), cache_spec(KVStorage::F16));
      cuda::deactivate();
      const RunOut g = run(*m, std::move(gc), ids, dec);
      std::string rows;
      for (int64_t t = 0; t < n_prefill; ++t)
        rows += fmt::format(" {:.1e}", rel_err(g.prefill.data() + t * V, cpu.prefill.data() + t * V, V));
      rows += " | decode:";
      for (size_t i = 0; i < g.steps.size(); ++i) rows += fmt::format(" {:.1e}", rel_err(g.steps[i].data(), cpu.steps[i].data(), V));
      const double worst = worst_err(g, cpu, n_prefill, V);
      EXPECT_LE(worst, 1e-3) << name << " run " << r << ", prefill rows:" << rows;
      std::printf("%s weights, run %d vs CPU: worst %.2e; prefill rows:%s\n", name, r, worst, rows.c_str());
    }
  }
}

// Session 27 diagnosis of the test above (which fails on the H200 in every switch setting
// for the bf16 model only, with GPU runs differing from each other): the same bf16 model with
// its weights on the GPU as bf16 and as fp32 (cuda::activate's WeightType), each GPU run
// against the CPU and against the GPU run before it, with 12 prompt rows and with 1.
TEST(CudaBackend, Bf16ModelWeightTypeDiagnosis) {
  auto m = random_hd64_gqa4_model("cuda_diag_bf16.gguf", DType::BF16);
  const int64_t V = m->config().vocab_size;
  for (int64_t n_prefill : {int64_t(1), int64_t(12)}) {
    const int64_t n_decode = 4, cap = n_prefill + n_decode;
    std::mt19937 rng(23);
    std::vector<int32_t> ids(static_cast<size_t>(n_prefill)), dec(static_cast<size_t>(n_decode));
    for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
    for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
    const RunOut cpu = run(*m, make_cache(m->cache_shape(cap), cache_spec(KVStorage::F16)), ids, dec);
    for (cuda::WeightType wt : {cuda::WeightType::Auto, cuda::WeightType::F32}) {
      const char* wn = wt == cuda::WeightType::Auto ? "bf16" : "f32";
      RunOut prev;
      for (int r = 0; r < 3; ++r) {
        cuda::activate(*m, wt);
        std::unique_ptr<KVCache> gc = make_cache(m->cache_shape(cap), cache_spec(KVStorage::F16));
        cuda::deactivate();
        const RunOut g = run(*m, std::move(gc), ids, dec);
        const double vs_cpu = worst_err(g, cpu, n_prefill, V);
        const double row0 = rel_err(g.prefill.data(), cpu.prefill.data(), V);
        const double vs_prev = r > 0 ? worst_err(g, prev, n_prefill, V) : 0.0;
        std::printf("diag: %2lld prompt rows, GPU weights %s, run %d: vs CPU worst %.2e (row 0 %.2e), vs previous GPU run %.2e\n",
                    (long long)n_prefill, wn, r, vs_cpu, row0, vs_prev);
        EXPECT_LE(vs_cpu, 1e-3) << n_prefill << " rows, GPU weights " << wn << ", run " << r;
        prev = g;
      }
    }
  }
}


// A GPU cache copied from another (bench --batch fills its sequences so) decodes as its
// source does, bit for bit: the copy is ordered before the copy's first step, whatever
// stream the copy and the steps are on. Plain fp16 and grouped int4 (codes, scales,
// residual and sinks are all copied), each with the ring of a StreamingLLM window wrapped.
TEST(CudaBackend, CopiedCacheDecodesAsItsSource) {
  auto m = load(fixture("hf/llama-gqa-tied"));
  const int64_t V = m->config().vocab_size;
  std::mt19937 rng(7);
  std::vector<int32_t> ids(40), dec(20);
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  for (auto& t : dec) t = int32_t(rng() % uint32_t(V));
  for (const CacheSpec& spec : {cache_spec(KVStorage::F16, 4, 20), cache_spec(KVStorage::Int4, 4, 24, RopeMode::Reposition, 8, 16)}) {
    SCOPED_TRACE(spec.describe());
    cuda::activate(*m);
    Decoder src(*m, make_cache(m->cache_shape(64), spec)), dst(*m, make_cache(m->cache_shape(64), spec));
    cuda::deactivate();
    src.prefill(ids, [](int64_t, int64_t, const float*) {});
    auto* dc = dynamic_cast<DeviceKVCache*>(&dst.cache());
    ASSERT_NE(dc, nullptr);
    dc->copy_from(src.cache());
    for (size_t i = 0; i < dec.size(); ++i) {
      const std::vector<float> a = src.step(dec[i]), b = dst.step(dec[i]);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "step " << i;
    }
  }
}


// EngineOptions::batch_invariant (--device-batch-invariant): a sequence's decode logits are the
// same bit for bit whether it steps alone, among 4 or among 20 (past the 16 rows at which the
// default engine takes the cuBLAS GEMM), for plain and grouped-KIVI caches, unbounded and
// windowed (the windows wrap), on a bf16 model (the one-row kernels and the GEMM are the paths
// that make the default engine's rows depend on the batch). Three sets of caches get the same
// prompts and tokens: each set's sequences are stepped alone, 4 together, or 20 together. The
// default engine's count of differing rows is printed beside it (documentation, not asserted:
// whether last-bit differences appear depends on the inputs). The invariant mode's own product
// kernel (gemv_tile_kernel) is checked against the CPU through the sequences with plain caches,
// stepped alone: within the fp16 cache's 1e-3 (the CPU multiplies the same bf16 weights in fp32).
TEST(CudaBackend, BatchInvariantModeMatchesEachSequenceAlone) {
  auto m = random_hd64_gqa4_model("cuda_invariant_bf16.gguf", DType::BF16);
  const int64_t V = m->config().vocab_size;
  constexpr int kB = 20, kFour = 4, kSteps = 8;
  const std::vector<CacheSpec> specs = {cache_spec(KVStorage::F16), cache_spec(KVStorage::F16, 4, 20),
                                        cache_spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 8, 16),
                                        cache_spec(KVStorage::Int2, 4, 24, RopeMode::Reposition, 8, 16),
                                        cache_spec(KVStorage::Int8, 0, 0, RopeMode::Reposition, 8, 16)};
  std::mt19937 rng(29);
  std::vector<std::vector<int32_t>> prompts(kB), toks(kB);
  for (int b = 0; b < kB; ++b) {
    prompts[size_t(b)].resize(size_t(3 + (b * 7) % 37));
    for (auto& t : prompts[size_t(b)]) t = int32_t(rng() % uint32_t(V));
    toks[size_t(b)].resize(kSteps);
    for (auto& t : toks[size_t(b)]) t = int32_t(rng() % uint32_t(V));
  }
  // The CPU's logits of each plain-cache sequence (b % 5 < 2), stepped alone: [kB][kSteps][V].
  std::vector<std::vector<std::vector<float>>> cpu(kB);
  for (int b = 0; b < kB; ++b) {
    const CacheSpec& spec = specs[size_t(b) % specs.size()];
    if (spec.quantised()) continue;
    const auto& p = prompts[size_t(b)];
    std::unique_ptr<KVCache> c = make_cache(m->cache_shape(int64_t(p.size()) + kSteps), spec);
    std::vector<float> lg(static_cast<size_t>(V));
    m->forward(p.data(), int64_t(p.size()), *c, lg.data(), false);
    KVCache* cp = c.get();
    for (int t = 0; t < kSteps; ++t) {
      m->forward_batch(&toks[size_t(b)][size_t(t)], 1, &cp, lg.data());
      cpu[size_t(b)].push_back(lg);
    }
  }
  double worst_vs_cpu = 0;
  for (bool invariant : {true, false}) {
    SCOPED_TRACE(invariant ? "batch-invariant" : "default");
    cuda::EngineOptions eo;
    eo.batch_invariant = invariant;
    cuda::activate(*m, cuda::WeightType::Auto, eo);
    std::vector<std::unique_ptr<KVCache>> alone, four, all;
    for (int b = 0; b < kB; ++b) {
      const CacheSpec& spec = specs[size_t(b) % specs.size()];
      const int64_t cap = int64_t(prompts[size_t(b)].size()) + kSteps;
      alone.push_back(make_cache(m->cache_shape(cap), spec));
      if (b < kFour) four.push_back(make_cache(m->cache_shape(cap), spec));
      all.push_back(make_cache(m->cache_shape(cap), spec));
    }
    cuda::deactivate();
    std::vector<float> scratch(static_cast<size_t>(V));
    for (int b = 0; b < kB; ++b) {
      const auto& p = prompts[size_t(b)];
      m->forward(p.data(), int64_t(p.size()), *alone[size_t(b)], scratch.data(), false);
      if (b < kFour) m->forward(p.data(), int64_t(p.size()), *four[size_t(b)], scratch.data(), false);
      m->forward(p.data(), int64_t(p.size()), *all[size_t(b)], scratch.data(), false);
    }
    int differ_four = 0, differ_all = 0;
    std::vector<float> one(static_cast<size_t>(V)), out4(size_t(kFour * V)), out20(size_t(kB * V));
    std::vector<KVCache*> c4, c20;
    for (auto& c : four) c4.push_back(c.get());
    for (auto& c : all) c20.push_back(c.get());
    for (int t = 0; t < kSteps; ++t) {
      std::vector<int32_t> ids(kB);
      for (int b = 0; b < kB; ++b) ids[size_t(b)] = toks[size_t(b)][size_t(t)];
      m->forward_batch(ids.data(), kFour, c4.data(), out4.data());
      m->forward_batch(ids.data(), kB, c20.data(), out20.data());
      for (int b = 0; b < kB; ++b) {
        KVCache* c = alone[size_t(b)].get();
        m->forward_batch(&ids[size_t(b)], 1, &c, one.data());
        ASSERT_TRUE(std::isfinite(one[0]));
        if (invariant && !cpu[size_t(b)].empty())
          worst_vs_cpu = std::max(worst_vs_cpu, rel_err(one.data(), cpu[size_t(b)][size_t(t)].data(), V));
        const bool d4 = b < kFour && std::memcmp(one.data(), out4.data() + b * V, size_t(V) * 4) != 0;
        const bool d20 = std::memcmp(one.data(), out20.data() + b * V, size_t(V) * 4) != 0;
        differ_four += d4;
        differ_all += d20;
        if (invariant) {
          EXPECT_FALSE(d4) << "step " << t << ", sequence " << b << " (" << specs[size_t(b) % specs.size()].describe()
                           << "): alone and among 4 differ";
          EXPECT_FALSE(d20) << "step " << t << ", sequence " << b << " (" << specs[size_t(b) % specs.size()].describe()
                            << "): alone and among 20 differ";
        }
      }
    }
    std::printf("%s engine: rows that differ from the same sequence alone: %d of %d among 4, %d of %d among 20\n",
                invariant ? "batch-invariant" : "default", differ_four, kFour * kSteps, differ_all, kB * kSteps);
  }
  std::printf("batch-invariant engine against the CPU (plain caches, alone): worst %.2e\n", worst_vs_cpu);
  EXPECT_GT(worst_vs_cpu, 0.0);  // the comparison ran
  EXPECT_LE(worst_vs_cpu, 1e-3);
}

}  // namespace

}  // namespace ptllm
