// Host side of the CUDA backend: weights on the GPU, GPU caches, and the
// forward pass that strings the kernels of kernels.h together (one stream,
// synchronous per call: logits come back at the end of each forward).
#include "cuda/backend.h"

#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "cuda/kernels.h"
#include "kv/cache_spec.h"
#include "model/device_cache.h"
#include "model/model.h"
#include "ops/ops.h"

namespace ptllm::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA {}: {}", what, cudaGetErrorString(e));
}

// A device allocation freed with its owner.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void reserve(size_t b) {
    if (b <= bytes) return;
    if (p) cudaFree(p);
    p = nullptr;
    check(cudaMalloc(&p, b), "cudaMalloc");
    bytes = b;
  }
  float* f() const { return static_cast<float*>(p); }
};

k::Elem elem_of(KVStorage s) {
  switch (s) {
    case KVStorage::F32: return k::Elem::F32;
    case KVStorage::F16: return k::Elem::F16;
    case KVStorage::BF16: return k::Elem::BF16;
    default: break;
  }
  fail("--device cuda: KV cache storage {} is not on the GPU yet (supported: fp32, fp16, bf16, int8, int4, int2)",
       storage_name(s));
}

// Code width of a grouped KIVI storage on the GPU (int3's 8-per-3-bytes packing is not).
int bits_of(KVStorage s) {
  switch (s) {
    case KVStorage::Int8: return 8;
    case KVStorage::Int4: return 4;
    case KVStorage::Int2: return 2;
    default: break;
  }
  fail("--device cuda: KV cache storage {} is not on the GPU yet (supported: fp32, fp16, bf16, int8, int4, int2)",
       storage_name(s));
}

// What the GPU cache does not do (yet): refused where the cache is made, one line each.
void check_supported(const CacheSpec& spec) {
  if (spec.k_storage() != spec.v_storage())
    fail("--device cuda: K and V stored differently ({}) is not on the GPU yet", spec.storage_label());
  if (spec.rotate != KVRotate::None) fail("--device cuda: --kv-rotate hadamard is not on the GPU yet");
  if (!is_quantised(spec.k_storage())) return;
  (void)bits_of(spec.k_storage());
  if (spec.kivi_group == 0)
    fail("--device cuda: the simple KIVI scheme (--kivi-group 0) is not on the GPU yet (grouped KIVI is)");
  if (spec.k_axis != KeyAxis::Channel) fail("--device cuda: --kivi-k-axis token is not on the GPU yet (channel is)");
}

struct GpuLayer {
  std::shared_ptr<DevBuf> wq, wk, wv, wo, gate, up, down, attn_norm, ffn_norm, bq, bk, bv;
};

class CudaCache;

// The model on the GPU, shared by every cache made while it is active.
class Engine {
 public:
  Engine(const Model& m, WeightType wt);
  ~Engine() {
    if (stream_) cudaStreamDestroy(stream_);
  }
  // n rows: one sequence of n tokens (n_caches = 1) or n sequences of one token.
  void run(const int32_t* tokens, int64_t n, CudaCache* const* caches, int64_t n_caches, float* logits,
           bool all_logits);
  const Model& model() const { return m_; }
  WeightType weights() const { return asked_; }
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  std::shared_ptr<DevBuf> upload(const TensorView& t, bool matrix);
  const Model& m_;
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

// K/V of every layer on the GPU. Plain storage (fp32/fp16/bf16): [layers][kvh][capacity][hd]
// per K and V, the PlainStore slot layout (sinks, then a ring). Grouped KIVI (int8/int4/int2):
// kv/grouped_store.h's layout per layer (k::KiviLayer). The slot bookkeeping is the same for
// every layer (one token per layer per step, no per-layer windows), so it is kept once here on
// the host.
class CudaCache : public DeviceKVCache {
 public:
  CudaCache(std::shared_ptr<Engine> eng, const KVCacheShape& s, const CacheSpec& spec)
      : DeviceKVCache(s), eng_(std::move(eng)), spec_(spec) {
    check_supported(spec);
    // A model window at least as long as the cache never masks or drops anything.
    if ((s.sliding_window > 0 && s.sliding_window < s.capacity) || !s.layer_window.empty())
      fail("--device cuda: a sliding attention window ({}) shorter than the cache ({}) is not on the GPU yet",
           s.sliding_window, s.capacity);
    if (s.head_dim % 2 || s.head_dim > 512) fail("--device cuda: head_dim {} (expected even, <= 512)", s.head_dim);
    if (s.capacity < 1) fail("KV cache: capacity {} (expected >= 1)", s.capacity);
    sink_cap_ = spec.streaming() ? std::min(spec.sink, s.capacity) : 0;
    ring_cap_ = s.capacity - sink_cap_;
    kivi_ = is_quantised(spec.k_storage());
    if (kivi_) {
      init_kivi();
      return;
    }
    e_ = elem_of(spec.k_storage());
    layer_elems_ = size_t(s.n_kv_heads * s.capacity * s.head_dim);
    const size_t bytes = layer_elems_ * size_t(s.n_layers) * size_t(k::elem_bytes(e_));
    k_.reserve(bytes);
    v_.reserve(bytes);
  }
  void forward(const int32_t* tokens, int64_t n, float* logits, bool all_logits) override {
    CudaCache* self = this;
    eng_->run(tokens, n, &self, 1, logits, all_logits);
  }
  void forward_batch(const int32_t* tokens, int64_t B, KVCache* const* caches, float* logits) override {
    std::vector<CudaCache*> cs(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      cs[size_t(b)] = dynamic_cast<CudaCache*>(caches[b]);
      if (!cs[size_t(b)] || cs[size_t(b)]->eng_ != eng_)
        fail("forward_batch: sequence {} is not a GPU cache of this model", b);
    }
    eng_->run(tokens, B, cs.data(), B, logits, true);
  }
  int64_t stored(int64_t) const override { return len_; }
  int64_t room() const override {
    const int64_t free = shape_.capacity - len_;
    return bounded() ? std::max<int64_t>(free, 1) : free;
  }
  bool bounded() const override { return spec_.streaming(); }
  // As the CPU stores count them (kv/grouped_store.cc payload_bytes / scale_bytes).
  size_t payload_bytes() const override {
    const size_t L = size_t(shape_.n_layers), kvh = size_t(shape_.n_kv_heads), hd = size_t(shape_.head_dim);
    if (!kivi_) return 2 * size_t(len_) * L * kvh * hd * size_t(k::elem_bytes(e_));
    return 2 * L * (size_t(st_.n_sink + st_.n_res) * kvh * hd * size_t(k::elem_bytes(re_)) +
                    size_t(st_.n_quant) * kvh * row_);
  }
  size_t scale_bytes() const override {
    if (!kivi_) return 0;
    const size_t L = size_t(shape_.n_layers), kvh = size_t(shape_.n_kv_heads);
    return L * kvh * 4 * (size_t(st_.n_groups * shape_.head_dim) + size_t(st_.n_quant));
  }
  std::string describe() const override {
    return fmt::format("{} · {} slots per layer · on the GPU", spec_.describe(), shape_.capacity);
  }
  void clear() override {
    KVCache::clear();
    len_ = 0;
    ring_start_ = 0;
    evicted_ = 0;
    st_ = post_ = KState{};
    ops_.clear();
  }

  // ---- used by Engine::run ----
  // Makes room for n new tokens (StreamingLLM: evicts the oldest non-sink
  // slots); returns the slot of the first new token. KIVI: also plans the
  // step's appends and group quantisations (run for each layer by kivi_append).
  int64_t begin_step(int64_t n) {
    if (len_ + n > shape_.capacity) {
      if (!bounded()) fail("KV cache full: {} stored + {} new > capacity {}", len_, n, shape_.capacity);
      if (n > 1)
        fail("KV cache: {} tokens in one step would overflow the StreamingLLM bound of {} (room() is {})", n,
             shape_.capacity, room());
      const int64_t drop = len_ + n - spec_.window - spec_.sink;  // slots [sink, sink + drop)
      // RowRing::pop_front of the non-sink ring.
      const int64_t in_ring = len_ - sink_cap_;
      ring_start_ = in_ring == drop ? 0 : (ring_start_ + drop) % ring_cap_;
      if (kivi_) kivi_evict(drop);
      len_ -= drop;
      evicted_ += drop;
    }
    if (kivi_) kivi_plan(n);
    return len_;
  }
  void end_step(int64_t n) {
    len_ += n;
    st_ = post_;
    advance(n);
  }
  bool kivi() const { return kivi_; }
  k::PlainLayer layer(int64_t l) const {
    k::PlainLayer c;
    const size_t off = size_t(l) * layer_elems_ * size_t(k::elem_bytes(e_));
    c.k = static_cast<char*>(k_.p) + off;
    c.v = static_cast<char*>(v_.p) + off;
    c.e = e_;
    c.kvh = int(shape_.n_kv_heads);
    c.cap = int(shape_.capacity);
    c.hd = int(shape_.head_dim);
    c.sink_cap = int(sink_cap_);
    c.ring_start = int(ring_start_);
    c.ring_cap = int(ring_cap_);
    return c;
  }
  // Layer l's KIVI buffers with the bookkeeping of `st` (default: after this step's appends).
  k::KiviLayer kivi_layer(int64_t l) const { return kivi_layer(l, post_); }
  // Runs this step's plan on layer l: k (pre-RoPE), v [n, kvh, hd] of the new tokens.
  void kivi_append(int64_t l, const float* k, const float* v, cudaStream_t s) const {
    const int64_t row = shape_.n_kv_heads * shape_.head_dim;
    for (const KOp& op : ops_) {
      const k::KiviLayer c = kivi_layer(l, op.before);
      if (op.flush)
        k::kivi_flush(c, int(op.qdst), int(op.rsrc), int(op.gslot), s);
      else
        k::kivi_append(c, k + op.src * row, v + op.src * row, int(op.n), op.to_sink, int(op.dst), s);
    }
  }
  const float* slot_table() const { return kcs_.f(); }
  // Angles of query i's rotation for slots below run_split() (A) and above (B):
  // kv/storage_cache.cc's runs. Plain keys are stored rotated at their position
  // (reposition: slot_q + off, absolute: pos_q); KIVI keys are pre-RoPE and turned
  // by their slot at read time (reposition: slot_q, absolute: pos_q - off), with
  // off = 0 for the sinks and the evicted count for the window.
  int64_t angle_a(int64_t slot_q, int64_t pos_q) const {
    return spec_.rope_mode == RopeMode::Reposition ? slot_q : pos_q;
  }
  int64_t angle_b(int64_t slot_q, int64_t pos_q) const {
    if (kivi_) return spec_.rope_mode == RopeMode::Reposition ? slot_q : pos_q - evicted_;
    return spec_.rope_mode == RopeMode::Reposition ? slot_q + evicted_ : pos_q;
  }
  int64_t run_split() const { return std::min(sink_cap_, len_); }
  int64_t len() const { return len_; }

 private:
  // Grouped KIVI bookkeeping, the CPU store's counters: sinks, quantised tokens, residual rows;
  // ring starts of the code rows (qstart, over capacity), the residual (rstart, over res_cap) and
  // the K group parameters (gstart, over gcap); live groups and the oldest one's length.
  struct KState {
    int64_t n_sink = 0, n_quant = 0, n_res = 0, qstart = 0, rstart = 0, gstart = 0, n_groups = 0, g0 = 0;
  };
  // One step of a plan: rows [src, src + n) of the new tokens to sink rows dst.. or residual ring
  // rows dst.., or (flush) quantise the G residual rows from rsrc into code rows qdst.. and group
  // slot gslot. `before`: the bookkeeping when it runs.
  struct KOp {
    bool flush = false, to_sink = false;
    int64_t src = 0, n = 0, dst = 0, qdst = 0, rsrc = 0, gslot = 0;
    KState before;
  };

  void init_kivi() {
    const auto& s = shape_;
    const int64_t G = spec_.kivi_group, R = spec_.kivi_residual, cap = s.capacity, hd = s.head_dim;
    bits_ = bits_of(spec_.k_storage());
    re_ = elem_of(spec_.residual_dtype);
    // The CPU store's sizes (GroupedKiviStore's constructor).
    res_cap_ = std::min(R + G, cap);
    gcap_ = cap / std::max<int64_t>(G, 1) + 2;
    row_ = size_t(bits_ == 8 ? hd : bits_ == 4 ? (hd + 1) / 2 : (hd + 3) / 4);
    const size_t L = size_t(s.n_layers), kvh = size_t(s.n_kv_heads), es = size_t(k::elem_bytes(re_));
    l_codes_ = kvh * size_t(cap) * row_;
    l_kpar_ = kvh * size_t(gcap_ * hd) * 2;
    l_vpar_ = kvh * size_t(cap) * 2;
    l_sink_ = kvh * size_t(std::max<int64_t>(sink_cap_, 1) * hd) * es;
    l_res_ = kvh * size_t(std::max<int64_t>(res_cap_, 1) * hd) * es;
    kcodes_.reserve(L * l_codes_);
    vcodes_.reserve(L * l_codes_);
    kpar_.reserve(L * l_kpar_ * 2);
    vpar_.reserve(L * l_vpar_ * 2);
    ksink_.reserve(L * l_sink_);
    vsink_.reserve(L * l_sink_);
    kres_.reserve(L * l_res_);
    vres_.reserve(L * l_res_);
    // Slot table: slot t's key rotation (cos, sin of angle t), as StorageKVCache::ensure_slot_table.
    std::vector<float> cs(size_t(cap * hd));
    for (int64_t t = 0; t < cap; ++t) rope().cos_sin(double(t), &cs[size_t(t * hd)], &cs[size_t(t * hd + hd / 2)]);
    kcs_.reserve(cs.size() * 4);
    check(cudaMemcpy(kcs_.p, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice), "slot table");
  }
  k::KiviLayer kivi_layer(int64_t l, const KState& st) const {
    k::KiviLayer c;
    const size_t L = size_t(l);
    c.kcodes = static_cast<uint8_t*>(kcodes_.p) + L * l_codes_;
    c.vcodes = static_cast<uint8_t*>(vcodes_.p) + L * l_codes_;
    c.kparams = static_cast<uint16_t*>(kpar_.p) + L * l_kpar_;
    c.vparams = static_cast<uint16_t*>(vpar_.p) + L * l_vpar_;
    c.ksink = static_cast<char*>(ksink_.p) + L * l_sink_;
    c.vsink = static_cast<char*>(vsink_.p) + L * l_sink_;
    c.kres = static_cast<char*>(kres_.p) + L * l_res_;
    c.vres = static_cast<char*>(vres_.p) + L * l_res_;
    c.re = re_;
    c.bits = bits_;
    c.kvh = int(shape_.n_kv_heads);
    c.cap = int(shape_.capacity);
    c.hd = int(shape_.head_dim);
    c.row = int(row_);
    c.sink_cap = int(sink_cap_);
    c.res_cap = int(res_cap_);
    c.gcap = int(gcap_);
    c.G = int(spec_.kivi_group);
    c.n_sink = int(st.n_sink);
    c.n_quant = int(st.n_quant);
    c.n_res = int(st.n_res);
    c.qstart = int(st.qstart);
    c.rstart = int(st.rstart);
    c.gstart = int(st.gstart);
    c.g0 = int(st.g0);
    return c;
  }
  // GroupedKiviStore::evict of the `drop` oldest non-sink tokens: quantised ones first (their
  // code rows leave the ring; the oldest K group is sliced, an emptied one leaves the group
  // ring), then residual rows. Moves nothing on the GPU.
  void kivi_evict(int64_t drop) {
    KState& st = st_;
    const int64_t kq = std::min(drop, st.n_quant);
    st.qstart = (st.qstart + kq) % shape_.capacity;
    for (int64_t left = kq; left > 0;) {
      const int64_t take = std::min(left, st.g0);
      st.g0 -= take;
      left -= take;
      if (st.g0 == 0) {
        st.gstart = (st.gstart + 1) % gcap_;
        --st.n_groups;
        st.g0 = st.n_groups > 0 ? spec_.kivi_group : 0;
      }
    }
    st.n_quant -= kq;
    const int64_t kr = drop - kq;
    if (kr > 0) {
      st.rstart = (st.rstart + kr) % res_cap_;
      st.n_res -= kr;
    }
  }
  // GroupedKiviStore::append of n tokens, as a list of kernel launches: sinks first (while fewer
  // than sink_cap are held), then the residual; when it holds R + G rows its oldest G are
  // quantised (in the middle of a prefill chunk too, exactly where the CPU does it).
  void kivi_plan(int64_t n) {
    const int64_t G = spec_.kivi_group, R = spec_.kivi_residual, cap = shape_.capacity;
    ops_.clear();
    KState st = st_;
    for (int64_t t = 0; t < n;) {
      KOp op;
      op.before = st;
      op.src = t;
      if (st.n_sink < sink_cap_) {
        op.to_sink = true;
        op.n = std::min(n - t, sink_cap_ - st.n_sink);
        op.dst = st.n_sink;
        st.n_sink += op.n;
        t += op.n;
        ops_.push_back(op);
        continue;
      }
      op.n = std::min(n - t, R + G - st.n_res);
      op.dst = (st.rstart + st.n_res) % res_cap_;
      st.n_res += op.n;
      t += op.n;
      ops_.push_back(op);
      if (st.n_res == R + G) {
        if (st.n_groups >= gcap_) fail("grouped KIVI cache: more than {} groups", gcap_);
        KOp f;
        f.flush = true;
        f.before = st;
        f.qdst = (st.qstart + st.n_quant) % cap;
        f.rsrc = st.rstart;
        f.gslot = (st.gstart + st.n_groups) % gcap_;
        ops_.push_back(f);
        st.n_quant += G;
        st.n_res -= G;
        st.rstart = (st.rstart + G) % res_cap_;
        if (st.n_groups++ == 0) st.g0 = G;
      }
    }
    post_ = st;
  }

  std::shared_ptr<Engine> eng_;
  CacheSpec spec_;
  k::Elem e_ = k::Elem::F32;
  int64_t sink_cap_ = 0, ring_cap_ = 0, ring_start_ = 0, len_ = 0, evicted_ = 0;
  size_t layer_elems_ = 0;
  DevBuf k_, v_;
  // Grouped KIVI.
  bool kivi_ = false;
  int bits_ = 8;
  k::Elem re_ = k::Elem::F16;
  int64_t res_cap_ = 0, gcap_ = 0;
  size_t row_ = 0, l_codes_ = 0, l_kpar_ = 0, l_vpar_ = 0, l_sink_ = 0, l_res_ = 0;  // per-layer sizes
  DevBuf kcodes_, vcodes_, kpar_, vpar_, ksink_, vsink_, kres_, vres_, kcs_;
  KState st_, post_;
  std::vector<KOp> ops_;
};

// Layer l of one sequence's step: stores its nb new K/V rows and attends its nb
// queries. kk [nb, KD] rotated at the keys' positions (plain caches), kraw the
// same keys before RoPE (KIVI), vv [nb, KD]; q [nb, nh * hd] un-rotated, qcs
// [nb, 2, hd] the query tables (angle_a / angle_b); out [nb, nh * hd].
void attend_layer(const CudaCache& cc, int64_t l, const float* kk, const float* kraw, const float* vv, const float* q,
                  const float* qcs, int64_t first, int64_t nb, int nh, float scale, float* out, float* part,
                  cudaStream_t s) {
  const int len = int(first + nb);
  if (cc.kivi()) {
    cc.kivi_append(l, kraw, vv, s);
    k::AttendKivi a;
    a.c = cc.kivi_layer(l);
    a.kcs = cc.slot_table();
    a.q = q;
    a.qcs = qcs;
    a.n = int(nb);
    a.nh = nh;
    a.len = len;
    a.first = int(first);
    a.run_split = int(std::min<int64_t>(cc.run_split(), len));
    a.scale = scale;
    a.out = out;
    a.part = part;
    k::attend_kivi(a, s);
    return;
  }
  k::Attend a;
  a.c = cc.layer(l);
  k::append_plain(a.c, kk, vv, int(nb), int(first), s);
  a.q = q;
  a.qcs = qcs;
  a.n = int(nb);
  a.nh = nh;
  a.len = len;
  a.first = int(first);
  a.run_split = int(std::min<int64_t>(cc.run_split(), len));
  a.scale = scale;
  a.out = out;
  a.part = part;
  k::attend_plain(a, s);
}

Engine::Engine(const Model& m, WeightType wt) : m_(m), asked_(wt) {
  const auto& c = m.config();
  if (c.yoco()) fail("--device cuda: YOCO models are not on the GPU yet");
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) fail("--device cuda: no CUDA GPU found");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
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
  ops::to_f32(t.data, t.dtype, tmp_.data(), n);
  auto b = std::make_shared<DevBuf>();
  const k::Elem e = matrix ? we_ : k::Elem::F32;
  b->reserve(size_t(n) * size_t(k::elem_bytes(e)));
  if (e == k::Elem::F32) {
    check(cudaMemcpy(b->p, tmp_.data(), size_t(n) * 4, cudaMemcpyHostToDevice), "upload");
  } else {
    DevBuf stage;
    stage.reserve(size_t(n) * 4);
    check(cudaMemcpy(stage.p, tmp_.data(), size_t(n) * 4, cudaMemcpyHostToDevice), "upload");
    k::convert(stage.f(), e, b->p, n, stream_);
    check(cudaStreamSynchronize(stream_), "convert");
  }
  weight_bytes_ += b->bytes;
  return b;
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
  bool any_kivi = false, any_plain = false;
  for (int64_t b = 0; b < n_caches; ++b) (caches[b]->kivi() ? any_kivi : any_plain) = true;
  const bool both = any_kivi && any_plain;  // a batch of both: keep a copy before RoPE
  const int64_t per_row = 3 * H + 2 * QD + 2 * KD + 2 * F + (both ? KD : 0);
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
  float* const kraw = both ? lg + n * V : kk;  // KIVI: keys before RoPE [n, KD]
  part_.reserve(size_t(k::attend_scratch_floats(int(batch ? 1 : n), int(NH), int(hd), int(max_len))) * 4 *
                size_t(batch ? n : 1));
  const float eps = float(c.rms_eps);
  const float scale = 1.0f / std::sqrt(float(hd));
  cudaStream_t s = stream_;
  k::embed(we_, embed_->p, static_cast<const int32_t*>(ids_.p), int(n), int(H), x, s);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const GpuLayer& w = layers_[size_t(l)];
    k::rmsnorm(x, w.attn_norm->f(), eps, int(n), int(H), xn, s);
    k::gemv(we_, w.wq->p, xn, w.bq ? w.bq->f() : nullptr, q, int(n), int(QD), int(H), false, s);
    k::gemv(we_, w.wk->p, xn, w.bk ? w.bk->f() : nullptr, kk, int(n), int(KD), int(H), false, s);
    k::gemv(we_, w.wv->p, xn, w.bv ? w.bv->f() : nullptr, vv, int(n), int(KD), int(H), false, s);
    // KIVI stores keys before RoPE (turned by slot at read time); plain caches rotated at their position.
    if (both) check(cudaMemcpyAsync(kraw, kk, size_t(n * KD) * 4, cudaMemcpyDeviceToDevice, s), "copy");
    if (any_plain) k::rope(kk, int(n), int(KVH), int(hd), d_kcs, s);
    for (int64_t b = 0; b < n_caches; ++b) {
      const int64_t r0 = batch ? b : 0, nb = batch ? 1 : n;
      float* const part = part_.f() + (batch ? b * k::attend_scratch_floats(1, int(NH), int(hd), int(max_len)) : 0);
      attend_layer(*caches[b], l, kk + r0 * KD, kraw + r0 * KD, vv + r0 * KD, q + r0 * QD, d_qcs + r0 * 2 * hd,
                   first[size_t(b)], nb, int(NH), scale, att + r0 * QD, part, s);
    }
    k::gemv(we_, w.wo->p, att, nullptr, x, int(n), int(H), int(QD), true, s);
    k::rmsnorm(x, w.ffn_norm->f(), eps, int(n), int(H), xn, s);
    k::gemv(we_, w.gate->p, xn, nullptr, gate, int(n), int(F), int(H), false, s);
    k::gemv(we_, w.up->p, xn, nullptr, up, int(n), int(F), int(H), false, s);
    k::silu_mul(gate, up, n * F, s);
    k::gemv(we_, w.down->p, gate, nullptr, x, int(n), int(H), int(F), true, s);
  }
  const int64_t rows = all_logits ? n : 1;
  const float* xl = all_logits ? x : x + (n - 1) * H;
  k::rmsnorm(xl, final_norm_->f(), eps, int(rows), int(H), xn, s);
  k::gemv(we_, lm_head_->p, xn, nullptr, lg, int(rows), int(V), int(H), false, s);
  check(cudaMemcpyAsync(logits, lg, size_t(rows * V) * 4, cudaMemcpyDeviceToHost, s), "logits");
  check(cudaStreamSynchronize(s), "forward");
  check(cudaGetLastError(), "kernel");
  for (int64_t b = 0; b < n_caches; ++b) caches[b]->end_step(batch ? 1 : n);
}

std::mutex g_mu;
std::shared_ptr<Engine> g_engine;
std::weak_ptr<Engine> g_last;

}  // namespace

WeightType parse_weight_type(const std::string& text, const std::string& flag) {
  if (text == "auto") return WeightType::Auto;
  if (text == "f32") return WeightType::F32;
  if (text == "bf16") return WeightType::BF16;
  if (text == "f16") return WeightType::F16;
  fail("{} {}: expected auto, f32, bf16 or f16", flag, text);
}

bool built() { return true; }

void activate(const Model& model, WeightType weights) {
  std::lock_guard lock(g_mu);
  // The same model again (another sequence of one batch): the same GPU weights.
  // (deactivate() lets go of the engine, but its caches may still hold it.)
  if (auto last = g_last.lock(); last && &last->model() == &model && last->weights() == weights) {
    g_engine = last;
    std::weak_ptr<Engine> weak = last;
    set_cache_factory([weak](const KVCacheShape& s, const CacheSpec& spec) -> std::unique_ptr<KVCache> {
      auto e = weak.lock();
      if (!e) fail("--device cuda: the GPU model was released");
      return std::make_unique<CudaCache>(e, s, spec);
    });
    return;
  }
  g_engine.reset();  // the previous model's weights go first (memory)
  auto eng = std::make_shared<Engine>(model, weights);
  g_engine = eng;
  g_last = eng;
  std::weak_ptr<Engine> weak = eng;
  set_cache_factory([weak](const KVCacheShape& s, const CacheSpec& spec) -> std::unique_ptr<KVCache> {
    auto e = weak.lock();
    if (!e) fail("--device cuda: the GPU model was released");
    return std::make_unique<CudaCache>(e, s, spec);
  });
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
#include "cuda/probe.h"

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

size_t LayerProbe::payload_bytes() const { return impl_->cache.payload_bytes(); }
size_t LayerProbe::scale_bytes() const { return impl_->cache.scale_bytes(); }

}  // namespace ptllm::cuda::testing
