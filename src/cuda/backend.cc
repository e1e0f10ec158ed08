// Host side of the CUDA backend: weights on the GPU and the forward pass that
// strings the kernels of kernels.h together (one stream, synchronous per call:
// logits come back at the end of each forward). The caches: gpu_cache.h.
#include "cuda/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "cuda/device_buffer.h"
#include "cuda/gemm.h"
#include "cuda/gpu_cache.h"
#include "cuda/kernels.h"
#include "cuda/probe.h"
#include "kv/cache_spec.h"
#include "model/device_cache.h"
#include "model/model.h"
#include "ops/ops.h"

namespace ptllm::cuda {

namespace {
std::atomic<int64_t> g_captured{0}, g_replayed{0}, g_direct{0};  // testing::graph_counts
std::atomic<int64_t> g_folded{0};                                 // testing::norm_folded_steps
}  // namespace

struct GpuLayer {
  std::shared_ptr<DevBuf> wq, wk, wv, wo, gate, up, down, attn_norm, ffn_norm, bq, bk, bv;
};

// The model on the GPU, shared by every cache made while it is active.
class Engine {
 public:
  Engine(const Model& m, WeightType wt, const EngineOptions& opt);
  ~Engine() {
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    if (pinned_) cudaFreeHost(pinned_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  // n rows: one sequence of n tokens (n_caches = 1) or n sequences of one token.
  void run(const int32_t* tokens, int64_t n, CudaCache* const* caches, int64_t n_caches, float* logits,
           bool all_logits);
  const Model& model() const { return m_; }
  cudaStream_t stream() const { return stream_; }
  WeightType weights() const { return asked_; }
  bool batch_invariant() const { return invariant_; }
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  std::shared_ptr<DevBuf> upload(const TensorView& t, bool matrix);
  // Runs enqueue's launches on s as the decode graph: replays the last one when key equals
  // the key it was captured with, else captures them (updating the last graph in place when
  // only arguments changed, instantiating a new one otherwise). False when graphs cannot be
  // used here (capture refused): they are then off for this engine, and nothing was launched.
  template <class F>
  bool run_graph(const std::vector<int64_t>& key, F&& enqueue, cudaStream_t s);
  // y[M, N] (+)= x W^T + bias: the GEMV kernel, or a cuBLAS GEMM (no bias) when gemm_ is set for
  // this step (run: gemm_rows_ rows or more, and fp32 weights or a decode batch).
  void linear(const DevBuf& W, const float* x, const DevBuf* bias, float* y, int M, int N, int K, bool acc,
              cudaStream_t s, const k::GemvPrefetch* next = nullptr);
  bool use_gemm_ = false;
  bool invariant_ = false;  // EngineOptions::batch_invariant
  const Model& m_;
  Gemm* gemm_ = nullptr;
  int64_t gemm_rows_ = 16, batch_launch_ = 2;
  // GEMV steps: q/k/v in one launch, gate/up/silu in one; one sequence's key RoPE in its
  // append (PTLLM_CUDA_FUSE=0: apart)
  bool fuse_ = true;
  // Page-locked staging for the logits of a decode step or batch (a copy to pageable memory
  // goes through the driver's own staging in pieces), grown to the largest copy up to
  // kPinnedFloats (64 MiB: a batch of 64 at a 128K vocabulary); larger copies go direct.
  static constexpr int64_t kPinnedFloats = int64_t(1) << 24;
  bool use_pinned_ = true;  // PTLLM_CUDA_PINNED=0: copy the logits to the caller's memory directly
  // Decode steps (one token per sequence, GEMV path) as a replayed CUDA graph: PTLLM_CUDA_GRAPH=1.
  bool use_graph_ = false;
  // One-row steps fold each RMSNorm into the GEMV after it: PTLLM_CUDA_NORM_FOLD=1.
  bool fold_norm_ = false;
  bool fold_lm_head_ = false;  // PTLLM_CUDA_NORM_FOLD_LM=1: the final norm into the LM head too
  // One-row steps' GEMVs prefetch up to this many bytes of the next GEMV's weights into L2
  // (k::GemvPrefetch): PTLLM_CUDA_L2_PREFETCH=MB, 0 (off) by default.
  int64_t prefetch_bytes_ = 0;
  cudaGraphExec_t graph_exec_ = nullptr;
  std::vector<int64_t> graph_key_;  // what graph_exec_ was captured with
  float* pinned_ = nullptr;
  int64_t pinned_floats_ = 0;
  BatchAttend batch_;
  DevBuf xb_;  // x rounded to the weight type for the GEMM
  WeightType asked_;
  k::Elem we_ = k::Elem::F32;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<DevBuf> embed_, lm_head_, final_norm_;
  std::vector<GpuLayer> layers_;
  size_t weight_bytes_ = 0;
  DevBuf ws_, part_, ids_, cs_;  // activations, attention partials, token ids, cos/sin tables
  std::vector<float> cs_host_;
  std::vector<float> tmp_;
  std::mutex mu_;
};

void CudaCache::forward(const int32_t* tokens, int64_t n, float* logits, bool all_logits) {
  if (!eng_) fail("GPU cache: no model to run (a probe cache)");
  CudaCache* self = this;
  eng_->run(tokens, n, &self, 1, logits, all_logits);
}

void CudaCache::forward_batch(const int32_t* tokens, int64_t B, KVCache* const* caches, float* logits) {
  if (!eng_) fail("GPU cache: no model to run (a probe cache)");
  std::vector<CudaCache*> cs(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    cs[size_t(b)] = dynamic_cast<CudaCache*>(caches[b]);
    if (!cs[size_t(b)] || cs[size_t(b)]->engine() != eng_.get())
      fail("forward_batch: sequence {} is not a GPU cache of this model", b);
  }
  eng_->run(tokens, B, cs.data(), B, logits, true);
}

cudaStream_t engine_stream(const Engine& e) { return e.stream(); }

Engine::Engine(const Model& m, WeightType wt, const EngineOptions& opt)
    : invariant_(opt.batch_invariant), m_(m), asked_(wt) {
  const auto& c = m.config();
  if (c.yoco()) fail("--device cuda: YOCO models are not on the GPU yet");
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) fail("--device cuda: no CUDA GPU found");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
  // PTLLM_CUDA_GEMM_ROWS=R: projections of R rows or more through cuBLAS (0: never; default 16).
  // PTLLM_CUDA_BATCH_LAUNCH=B: a decode batch of B sequences or more launches each attention
  // kernel once per layer for all of them (0: per sequence; default 2).
  const auto env_int = [](const char* name, int64_t dflt) {
    const char* v = std::getenv(name);
    if (!v || !*v) return dflt;
    char* end = nullptr;
    const long long x = std::strtoll(v, &end, 10);
    if (*end || x < 0) fail("{}={}: expected an integer >= 0", name, v);
    return int64_t(x);
  };
  gemm_rows_ = env_int("PTLLM_CUDA_GEMM_ROWS", 16);
  batch_launch_ = env_int("PTLLM_CUDA_BATCH_LAUNCH", 2);
  // PTLLM_CUDA_FUSE=0: the GEMV path launches q, k, v, gate, up and silu_mul apart (as before
  // session 13), for comparison; a fused launch computes each output row as the separate one
  // does (bit-identical where both split K alike: tests/cuda, FusedGemvMatchesSeparateLaunches).
  fuse_ = env_int("PTLLM_CUDA_FUSE", 1) != 0;
  use_pinned_ = env_int("PTLLM_CUDA_PINNED", 1) != 0;
  // PTLLM_CUDA_GRAPH=1: decode steps replay a captured graph instead of launching their ~9
  // kernels per layer one by one. Off by default: on the H200 (docs/CUDA.md, Session 24) it
  // passes every test but decodes the 1B shape no faster (its kernels, not its launches, set
  // the step); only a launch-bound model gains (stories260K 1.36-1.45x).
  use_graph_ = env_int("PTLLM_CUDA_GRAPH", 0) != 0;
  // PTLLM_CUDA_NORM_FOLD=1: a one-row step folds each RMSNorm into the GEMV after it (the
  // fused q/k/v, the SwiGLU and the LM head launches: k::GemvNorm), 33 launches fewer per
  // step of the 1B shape, where the one-block norm was 11% of the kernel time (docs/CUDA.md,
  // Session 24). Off until it has run on a GPU (written in session 25 without one).
  fold_norm_ = env_int("PTLLM_CUDA_NORM_FOLD", 0) != 0;
  fold_lm_head_ = env_int("PTLLM_CUDA_NORM_FOLD_LM", 0) != 0;
  // PTLLM_CUDA_L2_PREFETCH=MB: in a one-row step, each fused GEMV launch ends by prefetching
  // into L2 the first MB of the weights the next GEMV reads (q/k/v -> o, o -> gate and up, the
  // SwiGLU -> down, down -> the next layer's q and k or the LM head), so that DRAM keeps
  // streaming through the launches' tails and the attention kernels between them, where the
  // 1B step's GEMVs read at 1.2-2.3 TB/s against the LM head's 3.6 (docs/CUDA.md, Session
  // 24). Off until it has run on a GPU (written in session 25 without one).
  prefetch_bytes_ = env_int("PTLLM_CUDA_L2_PREFETCH", 0) << 20;
  if (invariant_) {
    // Batch-invariant steps (EngineOptions): no GEMM, attention per sequence, and none of
    // the one-row-only paths (graphs replay the batched attention launch; the folded norm
    // and the prefetch exist only in the one-row kernels).
    gemm_rows_ = 0;
    batch_launch_ = 0;
    use_graph_ = fold_norm_ = fold_lm_head_ = false;
    prefetch_bytes_ = 0;
  }
  if (gemm_rows_ > 0) gemm_ = Gemm::get();
  const TensorView& emb = m.tensors().get("model.embed_tokens.weight");
  if (wt == WeightType::Auto)
    wt = emb.dtype == DType::BF16 ? WeightType::BF16 : emb.dtype == DType::F16 ? WeightType::F16 : WeightType::F32;
  we_ = wt == WeightType::BF16 ? k::Elem::BF16 : wt == WeightType::F16 ? k::Elem::F16 : k::Elem::F32;
  embed_ = upload(emb, true);
  const bool tied = c.tie_embeddings || !m.tensors().has("lm_head.weight");
  lm_head_ = tied ? embed_ : upload(m.tensors().get("lm_head.weight"), true);
  final_norm_ = upload(m.tensors().get("model.norm.weight"), false);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const auto T = [&](const std::string& n) -> const TensorView& { return m.tensors().get(p + n); };
    GpuLayer g;
    g.attn_norm = upload(T("input_layernorm.weight"), false);
    g.ffn_norm = upload(T("post_attention_layernorm.weight"), false);
    g.wq = upload(T("self_attn.q_proj.weight"), true);
    g.wk = upload(T("self_attn.k_proj.weight"), true);
    g.wv = upload(T("self_attn.v_proj.weight"), true);
    g.wo = upload(T("self_attn.o_proj.weight"), true);
    g.gate = upload(T("mlp.gate_proj.weight"), true);
    g.up = upload(T("mlp.up_proj.weight"), true);
    g.down = upload(T("mlp.down_proj.weight"), true);
    if (c.qkv_bias) {
      g.bq = upload(T("self_attn.q_proj.bias"), false);
      g.bk = upload(T("self_attn.k_proj.bias"), false);
      g.bv = upload(T("self_attn.v_proj.bias"), false);
    }
    layers_.push_back(std::move(g));
  }
  check(cudaStreamSynchronize(stream_), "weight upload");
}

// Matrices as the chosen weight type, vectors (norms, biases) as fp32.
std::shared_ptr<DevBuf> Engine::upload(const TensorView& t, bool matrix) {
  const int64_t n = t.numel();
  tmp_.resize(size_t(n));
  ops::tensor_to_f32(t, tmp_.data());  // any layout (the _R16 types too)
  auto b = std::make_shared<DevBuf>();
  const k::Elem e = matrix ? we_ : k::Elem::F32;
  b->reserve(size_t(n) * size_t(k::elem_bytes(e)));
  // Copies on stream_, not cudaMemcpy: a copy from pageable memory returns once the bytes
  // are staged, before its DMA to the device ends, and the legacy stream it runs on does
  // not order a non-blocking stream's kernels. The conversion that followed it on stream_
  // read the staging buffer while the DMA was still writing it: bf16/f16 weights partly
  // garbage, different from run to run (session 27: Bf16ModelOneRowDecodeMatchesCpu
  // 0.5-1.9 relative against the CPU on the H200, fp32 weights 5.6e-5).
  if (e == k::Elem::F32) {
    check(cudaMemcpyAsync(b->p, tmp_.data(), size_t(n) * 4, cudaMemcpyHostToDevice, stream_), "upload");
    check(cudaStreamSynchronize(stream_), "upload");
  } else {
    DevBuf stage;
    stage.reserve(size_t(n) * 4);
    check(cudaMemcpyAsync(stage.p, tmp_.data(), size_t(n) * 4, cudaMemcpyHostToDevice, stream_), "upload");
    k::convert(stage.f(), e, b->p, n, stream_);
    check(cudaStreamSynchronize(stream_), "convert");
  }
  weight_bytes_ += b->bytes;
  return b;
}

void Engine::linear(const DevBuf& W, const float* x, const DevBuf* bias, float* y, int M, int N, int K, bool acc,
                    cudaStream_t s, const k::GemvPrefetch* next) {
  if (use_gemm_ && !bias) return gemm_->run(we_, W.p, x, xb_.p, y, M, N, K, acc, s);
  k::gemv(we_, W.p, x, bias ? bias->f() : nullptr, y, M, N, K, acc, s, next, invariant_);
}

template <class F>
bool Engine::run_graph(const std::vector<int64_t>& key, F&& enqueue, cudaStream_t s) {
  if (graph_exec_ && key == graph_key_) {
    check(cudaGraphLaunch(graph_exec_, s), "decode graph launch");
    ++g_replayed;
    return true;
  }
  // Nothing runs while the stream captures: the launches are recorded, then run as the graph.
  cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    try {
      enqueue();
    } catch (...) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(s, &g);
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      throw;
    }
    cudaGraph_t g = nullptr;
    e = cudaStreamEndCapture(s, &g);
    // The same kernels in the same order with other arguments (a longer sequence, another
    // buffer): updated in place; another topology (a split more, a combine launch): anew.
    if (e == cudaSuccess && graph_exec_) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(graph_exec_, g, &info) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaGraphExecDestroy(graph_exec_);
        graph_exec_ = nullptr;
      }
    }
    if (e == cudaSuccess && !graph_exec_) e = cudaGraphInstantiate(&graph_exec_, g, 0);
    if (g) cudaGraphDestroy(g);
  }
  if (e != cudaSuccess) {
    // E.g. a driver that cannot capture programmatic dependent launches: launch directly.
    (void)cudaGetLastError();
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    graph_key_.clear();
    use_graph_ = false;
    std::fprintf(stderr, "posttrainllm: CUDA graphs off (%s); decode steps launch their kernels one by one\n",
                 cudaGetErrorString(e));
    return false;
  }
  graph_key_ = key;
  check(cudaGraphLaunch(graph_exec_, s), "decode graph launch");
  ++g_captured;
  return true;
}

void Engine::run(const int32_t* tokens, int64_t n, CudaCache* const* caches, int64_t n_caches, float* logits,
                 bool all_logits) {
  std::lock_guard lock(mu_);  // one stream and one workspace: one step at a time
  const auto& c = m_.config();
  const int64_t H = c.hidden_size, F = c.intermediate_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t NH = c.n_heads, KVH = c.n_kv_heads, QD = NH * hd, KD = KVH * hd, half = hd / 2;
  const bool batch = n_caches > 1;
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= V) fail("token id {} is outside the vocabulary (0..{})", tokens[t], V - 1);
  // Per sequence b: its rows [r0, r0 + nb) and first new slot.
  std::vector<int64_t> first(static_cast<size_t>(n_caches));
  for (int64_t b = 0; b < n_caches; ++b) first[size_t(b)] = caches[b]->begin_step(batch ? 1 : n);
  // cos/sin per row: the key's position, the query's runs A and B: [n, 3, hd].
  const Rope& rope = caches[0]->rope();
  cs_host_.resize(size_t(n * 3 * hd));
  int64_t max_len = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t b = batch ? r : 0, i = batch ? 0 : r;
    const CudaCache& cc = *caches[b];
    const int64_t pos = cc.position() + i, slot = first[size_t(b)] + i;
    float* o = cs_host_.data() + r * 3 * hd;
    rope.cos_sin(double(pos), o, o + half);
    rope.cos_sin(double(cc.angle_a(slot, pos)), o + hd, o + hd + half);
    rope.cos_sin(double(cc.angle_b(slot, pos)), o + 2 * hd, o + 2 * hd + half);
    max_len = std::max(max_len, first[size_t(b)] + (batch ? 1 : n));
  }
  cs_.reserve(cs_host_.size() * 4);
  // Query tables [n, 2, hd] and key tables [n, hd] split out of the [n, 3, hd] rows.
  std::vector<float> qcs(size_t(n * 2 * hd)), kcs(size_t(n * hd));
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(cs_host_.data() + r * 3 * hd, hd, kcs.data() + r * hd);
    std::copy_n(cs_host_.data() + r * 3 * hd + hd, 2 * hd, qcs.data() + r * 2 * hd);
  }
  std::copy(kcs.begin(), kcs.end(), cs_host_.begin());
  std::copy(qcs.begin(), qcs.end(), cs_host_.begin() + n * hd);
  check(cudaMemcpyAsync(cs_.p, cs_host_.data(), cs_host_.size() * 4, cudaMemcpyHostToDevice, stream_), "copy");
  const float* d_kcs = cs_.f();
  const float* d_qcs = cs_.f() + n * hd;
  ids_.reserve(size_t(n) * 4);
  check(cudaMemcpyAsync(ids_.p, tokens, size_t(n) * 4, cudaMemcpyHostToDevice, stream_), "copy");

  // KIVI caches take the keys before RoPE, plain ones rotated at their position.
  bool any_kivi = false, any_plain = false, flush = false;
  for (int64_t b = 0; b < n_caches; ++b) {
    (caches[b]->kivi() ? any_kivi : any_plain) = true;
    flush = flush || caches[b]->kivi_flush_pending();
  }
  const bool both = any_kivi && any_plain;
  // The GEMM rounds x to the weight type first (fp16/bf16 weights): done for decode batches,
  // where it is the point; a prefill chunk keeps fp32 activations (the GEMV kernel) unless the
  // weights are fp32 (an fp32 GEMM), so one sequence's logits stay within the CPU tolerances.
  use_gemm_ = gemm_ && n >= gemm_rows_ && (batch || we_ == k::Elem::F32);
  // One sequence's decode step takes the batched attention launch too when graphs are on: its
  // per-step values (slots, lengths, ring start) then live in device memory, not in the
  // launches' arguments, so the same graph replays step after step.
  const bool one_step = n_caches == 1 && n == 1;
  const bool batched = (batch && batch_launch_ > 0 && n_caches >= batch_launch_) || (one_step && use_graph_);
  // Plain caches' keys rotated in their append (one launch less per layer): one sequence's
  // plain cache (append_plain's kcs) or, with graphs on, a batched launch (its parameters' kcs;
  // tied to graphs until it has run on a GPU, so the default batch path is as measured).
  // Batch-invariant: a sequence alone rotates its keys as it does in a batch (a separate launch).
  const bool rope_in_append = fuse_ && ((batched && use_graph_) || (n_caches == 1 && !any_kivi && !invariant_));
  // A batch of both kinds keeps a copy of the keys before a separate RoPE launch.
  const bool keep_raw = both && !rope_in_append;
  const int64_t per_row = 3 * H + 2 * QD + 2 * KD + 2 * F + (keep_raw ? KD : 0);
  ws_.reserve(size_t(n * per_row + n * V) * 4);
  float* const x = ws_.f();
  float* const xn = x + n * H;
  float* const q = xn + n * H;
  float* const att = q + n * QD;
  float* const kk = att + n * QD;
  float* const vv = kk + n * KD;
  float* const gate = vv + n * KD;
  float* const up = gate + n * F;
  float* const lg = up + n * F + n * H;
  float* const kraw = keep_raw ? lg + n * V : kk;  // KIVI: keys before RoPE [n, KD]
  part_.reserve(size_t(k::attend_scratch_floats(int(batch ? 1 : n), int(NH), int(hd), int(max_len))) * 4 *
                size_t(batch ? n : 1));
  if (use_gemm_) xb_.reserve(size_t(n * std::max({H, QD, F})) * 2);
  const int64_t part_stride = k::attend_scratch_floats(1, int(NH), int(hd), int(max_len));
  if (batched)
    batch_.plan(caches, n_caches, first.data(), c.n_layers, int(NH), 1.0f / std::sqrt(float(hd)), kk, kraw, vv, q,
                d_qcs, att, part_.f(), part_stride, stream_, rope_in_append ? d_kcs : nullptr);
  const float eps = float(c.rms_eps);
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t rows = all_logits ? n : 1;
  cudaStream_t s = stream_;
  // The step's launches, from the embedding to the logits in lg.
  // The norms folded into the GEMVs after them (k::GemvNorm): only where those are one-row
  // launches (a decode step; the kernels fall back to a separate norm for anything else).
  const bool fold = fold_norm_ && fuse_ && !use_gemm_ && k::gemv_folds_norm(we_, int(n), int(H), x);
  if (fold) ++g_folded;
  // L2 prefetch ranges (k::GemvPrefetch) for one-row fused GEMV launches: up to
  // prefetch_bytes_ in all from the start of the weights named.
  const bool prefetch = prefetch_bytes_ > 0 && fuse_ && !use_gemm_ && n == 1 && we_ != k::Elem::F32;
  const int64_t es = k::elem_bytes(we_);
  const auto next_of = [&](const DevBuf* a, int64_t a_bytes, const DevBuf* b, int64_t b_bytes) {
    k::GemvPrefetch p;
    if (!prefetch) return p;
    const int64_t first = std::min(a_bytes, b ? prefetch_bytes_ / 2 : prefetch_bytes_);
    p.p[0] = a->p, p.bytes[0] = first & ~int64_t(15);
    if (b) p.p[1] = b->p, p.bytes[1] = std::min(b_bytes, prefetch_bytes_ - first) & ~int64_t(15);
    return p;
  };
  const auto enqueue = [&] {
    k::embed(we_, embed_->p, static_cast<const int32_t*>(ids_.p), int(n), int(H), x, s);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const GpuLayer& w = layers_[size_t(l)];
      if (!fold) k::rmsnorm(x, w.attn_norm->f(), eps, int(n), int(H), xn, s);
      if (fuse_ && !use_gemm_) {
        k::GemvSegs qkv;
        qkv.o[0] = k::GemvOut{w.wq->p, w.bq ? w.bq->f() : nullptr, q, int(QD), false};
        qkv.o[1] = k::GemvOut{w.wk->p, w.bk ? w.bk->f() : nullptr, kk, int(KD), false};
        qkv.o[2] = k::GemvOut{w.wv->p, w.bv ? w.bv->f() : nullptr, vv, int(KD), false};
        qkv.n = 3;
        qkv.rows_alike = invariant_;
        if (fold) qkv.norm = k::GemvNorm{w.attn_norm->f(), eps, xn};
        qkv.next = next_of(w.wo.get(), QD * H * es, nullptr, 0);
        k::gemv_multi(we_, qkv, fold ? x : xn, int(n), int(H), s);
      } else {
        linear(*w.wq, xn, w.bq.get(), q, int(n), int(QD), int(H), false, s);
        linear(*w.wk, xn, w.bk.get(), kk, int(n), int(KD), int(H), false, s);
        linear(*w.wv, xn, w.bv.get(), vv, int(n), int(KD), int(H), false, s);
      }
      // KIVI stores keys before RoPE (turned by slot at read time); plain caches rotated at their position.
      if (keep_raw) check(cudaMemcpyAsync(kraw, kk, size_t(n * KD) * 4, cudaMemcpyDeviceToDevice, s), "copy");
      if (any_plain && !rope_in_append) k::rope(kk, int(n), int(KVH), int(hd), d_kcs, s);
      if (batched) batch_.run_layer(l, s);
      for (int64_t b = 0; b < n_caches && !batched; ++b) {
        const int64_t r0 = batch ? b : 0, nb = batch ? 1 : n;
        float* const part = part_.f() + (batch ? b * part_stride : 0);
        attend_layer(*caches[b], l, kk + r0 * KD, kraw + r0 * KD, vv + r0 * KD, q + r0 * QD, d_qcs + r0 * 2 * hd,
                     first[size_t(b)], nb, int(NH), scale, att + r0 * QD, part, s, rope_in_append ? d_kcs : nullptr);
      }
      const k::GemvPrefetch to_glu = next_of(w.gate.get(), F * H * es, w.up.get(), F * H * es);
      linear(*w.wo, att, nullptr, x, int(n), int(H), int(QD), true, s, &to_glu);
      if (!fold) k::rmsnorm(x, w.ffn_norm->f(), eps, int(n), int(H), xn, s);
      if (fold) {
        k::gemv_swiglu(we_, w.gate->p, w.up->p, x, gate, int(n), int(F), int(H), s,
                       k::GemvNorm{w.ffn_norm->f(), eps, xn}, next_of(w.down.get(), H * F * es, nullptr, 0));
      } else if (fuse_ && !use_gemm_) {
        k::gemv_swiglu(we_, w.gate->p, w.up->p, xn, gate, int(n), int(F), int(H), s, k::GemvNorm{},
                       next_of(w.down.get(), H * F * es, nullptr, 0), invariant_);
      } else {
        linear(*w.gate, xn, nullptr, gate, int(n), int(F), int(H), false, s);
        linear(*w.up, xn, nullptr, up, int(n), int(F), int(H), false, s);
        k::silu_mul(gate, up, n * F, s);
      }
      const k::GemvPrefetch to_next =
          l + 1 < c.n_layers ? next_of(layers_[size_t(l + 1)].wq.get(), QD * H * es, layers_[size_t(l + 1)].wk.get(),
                                       KD * H * es)
                             : next_of(lm_head_.get(), V * H * es, nullptr, 0);
      linear(*w.down, gate, nullptr, x, int(n), int(H), int(F), true, s, &to_next);
    }
    const float* xl = all_logits ? x : x + (n - 1) * H;
    // The final norm stays its own launch: folded into the LM head (k::gemv_normed) it made
    // that GEMV 147.6 -> 210 us on the 1B shape (ncu on the H200, session 26: the norm
    // weight's loads double each weight word's loads of x), more than the launch it saves.
    if (fold && fold_lm_head_) {
      k::gemv_normed(we_, lm_head_->p, xl, k::GemvNorm{final_norm_->f(), eps, xn}, lg, int(rows), int(V), int(H), s);
    } else {
      k::rmsnorm(xl, final_norm_->f(), eps, int(rows), int(H), xn, s);
      linear(*lm_head_, xn, nullptr, lg, int(rows), int(V), int(H), false, s);
    }
  };
  // A decode step through the batched launch, with no cuBLAS GEMM (its own launches) and
  // no KIVI group flush (launched with this step's ring rows as arguments), replays the
  // graph: everything else that varies per step (token ids, RoPE tables, the attention
  // parameters) is uploaded above into buffers whose addresses are part of the key.
  bool graphed = false;
  if (use_graph_ && batched && !use_gemm_ && !flush) {
    std::vector<int64_t> key = {n,
                                n_caches,
                                int64_t(all_logits),
                                int64_t(reinterpret_cast<uintptr_t>(ws_.p)),
                                int64_t(reinterpret_cast<uintptr_t>(cs_.p)),
                                int64_t(reinterpret_cast<uintptr_t>(ids_.p)),
                                int64_t(reinterpret_cast<uintptr_t>(part_.p)),
                                int64_t(rope_in_append),
                                int64_t(keep_raw),
                                int64_t(any_plain),
                                int64_t(fuse_)};
    batch_.launch_key(key);
    graphed = run_graph(key, enqueue, s);
  }
  if (!graphed) {
    enqueue();
    ++g_direct;
  }
  const int64_t n_out = rows * V;
  const bool staged = use_pinned_ && n_out <= kPinnedFloats;
  if (staged && n_out > pinned_floats_) {
    if (pinned_) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_floats_ = 0;
    check(cudaMallocHost(reinterpret_cast<void**>(&pinned_), size_t(n_out) * 4), "pinned logits buffer");
    pinned_floats_ = n_out;
  }
  check(cudaMemcpyAsync(staged ? pinned_ : logits, lg, size_t(n_out) * 4, cudaMemcpyDeviceToHost, s), "logits");
  check(cudaStreamSynchronize(s), "forward");
  check(cudaGetLastError(), "kernel");
  // Out of the page-locked buffer in pieces across threads for large copies (a batch
  // of 64 at a 128K vocabulary is 33 MB: several ms on one thread; docs/CUDA.md,
  // "Session 22"), in one memcpy for a single sequence's row.
  if (staged) {
    constexpr int64_t kPiece = int64_t(1) << 18;  // floats (1 MiB)
    const int64_t pieces = (n_out + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static) if (pieces >= 4)
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t a = p * kPiece, e = std::min(n_out, a + kPiece);
      std::memcpy(logits + a, pinned_ + a, size_t(e - a) * 4);
    }
  }
  for (int64_t b = 0; b < n_caches; ++b) caches[b]->end_step(batch ? 1 : n);
}

namespace testing {
GraphCounts graph_counts() { return GraphCounts{g_captured.load(), g_replayed.load(), g_direct.load()}; }
int64_t norm_folded_steps() { return g_folded.load(); }
}  // namespace testing

namespace {
std::mutex g_mu;
std::shared_ptr<Engine> g_engine;
std::weak_ptr<Engine> g_last;

// make_cache builds GPU caches of `eng` while it lives.
void route_caches_to(const std::shared_ptr<Engine>& eng) {
  std::weak_ptr<Engine> weak = eng;
  set_cache_factory([weak](const KVCacheShape& s, const CacheSpec& spec) -> std::unique_ptr<KVCache> {
    auto e = weak.lock();
    if (!e) fail("--device cuda: the GPU model was released");
    return std::make_unique<CudaCache>(e, s, spec);
  });
}
}  // namespace

bool built() { return true; }

void activate(const Model& model, WeightType weights, const EngineOptions& options) {
  std::lock_guard lock(g_mu);
  // The same model again (another sequence of one batch): the same GPU weights.
  // (deactivate() lets go of the engine, but its caches may still hold it.)
  if (auto last = g_last.lock(); last && &last->model() == &model && last->weights() == weights &&
                                 last->batch_invariant() == options.batch_invariant) {
    g_engine = last;
    route_caches_to(last);
    return;
  }
  g_engine.reset();  // the previous model's weights go first (memory)
  auto eng = std::make_shared<Engine>(model, weights, options);
  g_engine = eng;
  g_last = eng;
  route_caches_to(eng);
}

void deactivate() {
  std::lock_guard lock(g_mu);
  set_cache_factory({});
  g_engine.reset();
}

std::string device_name() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) return "no CUDA GPU";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA GPU (properties unavailable)";
  return fmt::format("{} (sm_{}{}, {:.0f} GiB)", p.name, p.major, p.minor, double(p.totalGlobalMem) / (1 << 30));
}

}  // namespace ptllm::cuda

// ---------------- tests: one layer without a model (probe.h) ----------------

namespace ptllm::cuda::testing {

struct LayerProbe::Impl {
  CudaCache cache;
  cudaStream_t s = nullptr;
  DevBuf k, kraw, v, q, cs, out, part;
  Impl(const KVCacheShape& shape, const CacheSpec& spec) : cache(nullptr, shape, spec) {
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  }
  ~Impl() {
    if (s) cudaStreamDestroy(s);
  }
};

LayerProbe::LayerProbe(const KVCacheShape& shape, const CacheSpec& spec) {
  if (shape.n_layers != 1) fail("LayerProbe: {} layers (expected 1)", shape.n_layers);
  spec.check();
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) fail("--device cuda: no CUDA GPU found");
  impl_ = std::make_unique<Impl>(shape, spec.canonical());
}

LayerProbe::~LayerProbe() = default;

// The attention part of Engine::run for one sequence and one layer.
void LayerProbe::step(const float* k, const float* v, const float* q, int64_t n, float* out) {
  CudaCache& c = impl_->cache;
  const KVCacheShape& sh = c.shape();
  const int64_t hd = sh.head_dim, half = hd / 2, KD = sh.n_kv_heads * hd, QD = sh.n_heads * hd;
  const int64_t first = c.begin_step(n);
  // Key tables [n, hd] at the tokens' positions, then the query tables [n, 2, hd].
  std::vector<float> cs(size_t(n * 3 * hd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = c.position() + i, slot = first + i;
    float* kc = cs.data() + i * hd;
    float* qc = cs.data() + n * hd + i * 2 * hd;
    c.rope().cos_sin(double(pos), kc, kc + half);
    c.rope().cos_sin(double(c.angle_a(slot, pos)), qc, qc + half);
    c.rope().cos_sin(double(c.angle_b(slot, pos)), qc + hd, qc + hd + half);
  }
  Impl& m = *impl_;
  const cudaStream_t s = m.s;
  const auto up = [&](DevBuf& b, const float* src, int64_t count) {
    b.reserve(size_t(count) * 4);
    check(cudaMemcpyAsync(b.p, src, size_t(count) * 4, cudaMemcpyHostToDevice, s), "copy");
  };
  up(m.k, k, n * KD);
  up(m.kraw, k, n * KD);
  up(m.v, v, n * KD);
  up(m.q, q, n * QD);
  up(m.cs, cs.data(), int64_t(cs.size()));
  m.out.reserve(size_t(n * QD) * 4);
  m.part.reserve(size_t(k::attend_scratch_floats(int(n), int(sh.n_heads), int(hd), int(first + n))) * 4);
  k::rope(m.k.f(), int(n), int(sh.n_kv_heads), int(hd), m.cs.f(), s);
  attend_layer(c, 0, m.k.f(), m.kraw.f(), m.v.f(), m.q.f(), m.cs.f() + n * hd, first, n, int(sh.n_heads),
               1.0f / std::sqrt(float(hd)), m.out.f(), m.part.f(), s);
  check(cudaMemcpyAsync(out, m.out.p, size_t(n * QD) * 4, cudaMemcpyDeviceToHost, s), "copy");
  check(cudaStreamSynchronize(s), "probe step");
  check(cudaGetLastError(), "kernel");
  c.end_step(n);
}

double LayerProbe::time_attention(const float* k, const float* v, const float* q, int reps, size_t flush_bytes) {
  Impl& m = *impl_;
  CudaCache& c = m.cache;
  const KVCacheShape& sh = c.shape();
  std::vector<float> out(size_t(sh.n_heads * sh.head_dim));
  step(k, v, q, 1, out.data());
  // The step's query (m.q, its tables at m.cs + hd) at the newest slot.
  const int len = int(c.len()), hd = int(sh.head_dim);
  const auto fill = [&](auto& a) {
    a.q = m.q.f();
    a.qcs = m.cs.f() + hd;
    a.n = 1;
    a.nh = int(sh.n_heads);
    a.len = len;
    a.first = len - 1;
    a.run_split = int(std::min<int64_t>(c.run_split(), len));
    a.scale = 1.0f / std::sqrt(float(hd));
    a.out = m.out.f();
    a.part = m.part.f();
  };
  m.part.reserve(size_t(k::attend_scratch_floats(1, int(sh.n_heads), hd, len)) * 4);
  k::AttendKivi ak;
  k::Attend ap;
  if (c.kivi()) {
    ak.c = c.kivi_layer(0);
    ak.kcs = c.slot_table();
    fill(ak);
  } else {
    ap.c = c.layer(0);
    fill(ap);
  }
  const auto launch = [&] { c.kivi() ? k::attend_kivi(ak, m.s) : k::attend_plain(ap, m.s); };
  launch();  // warm-up
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  float ms = 0;
  if (flush_bytes > 0) {
    DevBuf junk;
    junk.reserve(flush_bytes);
    for (int r = 0; r < reps; ++r) {
      check(cudaMemsetAsync(junk.p, r & 0xff, flush_bytes, m.s), "memset");
      check(cudaEventRecord(e0, m.s), "event");
      launch();
      check(cudaEventRecord(e1, m.s), "event");
      check(cudaEventSynchronize(e1), "event");
      float one = 0;
      check(cudaEventElapsedTime(&one, e0, e1), "event");
      ms += one;
    }
  } else {
    check(cudaEventRecord(e0, m.s), "event");
    for (int r = 0; r < reps; ++r) launch();
    check(cudaEventRecord(e1, m.s), "event");
    check(cudaEventSynchronize(e1), "event");
    check(cudaEventElapsedTime(&ms, e0, e1), "event");
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  check(cudaGetLastError(), "kernel");
  return double(ms) / 1e3 / std::max(reps, 1);
}

size_t LayerProbe::payload_bytes() const { return impl_->cache.payload_bytes(); }
size_t LayerProbe::scale_bytes() const { return impl_->cache.scale_bytes(); }

}  // namespace ptllm::cuda::testing
