// The GPU KV cache of the CUDA backend (CUDA builds only; backend.cc drives
// it): K/V of every layer in device memory, the slot bookkeeping on the host.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "cuda/kernels.h"
#include "kv/cache_spec.h"
#include "model/device_cache.h"

namespace ptllm::cuda {

class Engine;  // the model on the GPU (backend.cc)
// The stream every launch of `e` goes on (non-blocking: it does not wait for the legacy stream).
cudaStream_t engine_stream(const Engine& e);

// K/V of every layer on the GPU. Plain storage (fp32/fp16/bf16): [layers][kvh][capacity][hd]
// per K and V, the PlainStore slot layout (sinks, then a ring). Grouped KIVI (int8/int4/int2):
// kv/grouped_store.h's layout per layer (k::KiviLayer). The slot bookkeeping is the same for
// every layer (one token per layer per step, no per-layer windows), so it is kept once here on
// the host. `eng` may be null for a cache driven without a model (probe.h).
class CudaCache : public DeviceKVCache {
 public:
  CudaCache(std::shared_ptr<Engine> eng, const KVCacheShape& s, const CacheSpec& spec);

  // DeviceKVCache (forward and forward_batch run the engine: backend.cc).
  void forward(const int32_t* tokens, int64_t n, float* logits, bool all_logits) override;
  void forward_batch(const int32_t* tokens, int64_t B, KVCache* const* caches, float* logits) override;
  int64_t stored(int64_t) const override { return len_; }
  int64_t room() const override;
  bool bounded() const override { return spec_.streaming(); }
  size_t payload_bytes() const override;
  size_t scale_bytes() const override;
  std::string describe() const override;
  void clear() override;
  void copy_from(const KVCache& other) override;
  size_t device_bytes() const override;

  // ---- used by Engine::run ----
  // Makes room for n new tokens (StreamingLLM: evicts the oldest non-sink
  // slots); returns the slot of the first new token. KIVI: also plans the
  // step's appends and group quantisations (run for each layer by kivi_append).
  int64_t begin_step(int64_t n);
  void end_step(int64_t n) {
    len_ += n;
    st_ = post_;
    advance(n);
  }
  bool kivi() const { return kivi_; }
  const Engine* engine() const { return eng_.get(); }
  k::PlainLayer layer(int64_t l) const;
  // Layer l's KIVI buffers with the bookkeeping after this step's appends.
  k::KiviLayer kivi_layer(int64_t l) const { return kivi_layer(l, post_); }
  // Runs this step's plan on layer l: k (pre-RoPE), v [n, kvh, hd] of the new tokens.
  void kivi_append(int64_t l, const float* k, const float* v, cudaStream_t s) const;
  const float* slot_table() const { return kcs_.f(); }
  // Batched decode (one new token): this step's append as a batched-launch parameter
  // (plan of begin_step(1): one append, then maybe a group flush), and the flush launches.
  k::AppendKiviB kivi_append_param(int64_t l, const float* k, const float* v) const;
  void kivi_flushes(int64_t l, cudaStream_t s) const;
  // This step (after begin_step) quantises a residual group: kivi_flushes launches with
  // this step's ring rows as arguments (so a captured decode graph cannot replay them).
  bool kivi_flush_pending() const { return kivi_ && ops_.size() > 1; }
  k::Elem elem() const { return e_; }
  k::Elem residual_elem() const { return re_; }
  int bits() const { return bits_; }
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

  // Where this cache's copies go: the engine's stream, so that its kernels see them in order
  // (the legacy stream without an engine, as probe.h's kernels run there).
  cudaStream_t stream() const;
  void init_kivi();
  k::KiviLayer kivi_layer(int64_t l, const KState& st) const;
  void kivi_evict(int64_t drop);
  void kivi_plan(int64_t n);

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

// Batched decode over B sequences of one token each: the sequences are grouped by
// storage kind, and each group's append, attention and combine are one launch per
// layer; the per-sequence, per-layer parameters of the whole step are uploaded once
// (plan), before the layers run.
class BatchAttend {
 public:
  BatchAttend();
  ~BatchAttend();
  BatchAttend(const BatchAttend&) = delete;
  BatchAttend& operator=(const BatchAttend&) = delete;
  // Rows b of kk (rotated keys), kraw (pre-RoPE), vv [B, KD], q [B, nh * hd], qcs [B, 2, hd]
  // and out [B, nh * hd]; part: scratch of part_stride floats per sequence. kcs [B, hd]:
  // when given, kk is not rotated yet and the plain caches' appends rotate it.
  void plan(CudaCache* const* caches, int64_t B, const int64_t* first, int64_t n_layers, int nh, float scale,
            const float* kk, const float* kraw, const float* vv, const float* q, const float* qcs, float* out,
            float* part, int64_t part_stride, cudaStream_t s, const float* kcs = nullptr);
  void run_layer(int64_t l, cudaStream_t s) const;
  // What run_layer's launches take as arguments beyond the parameters in device memory
  // (their address, the groups' kinds, sizes, split counts and KIVI plans), appended to key:
  // equal keys launch the same kernels with the same arguments (Engine's decode graph).
  void launch_key(std::vector<int64_t>& key) const;

 private:
  struct Group {
    bool kivi = false;
    k::Elem e = k::Elem::F16;
    int bits = 0;
    std::vector<int64_t> seqs;
    int S = 0;
    int64_t max_len = 0;    // slots of the longest sequence
    k::KiviDecPlan plan;    // KIVI: the decode kernel and its split
    size_t app_bytes = 0, att_bytes = 0;  // per layer
    size_t off = 0;                       // within a layer's parameters
  };
  std::vector<Group> groups_;
  CudaCache* const* caches_ = nullptr;
  int nh_ = 0, kvh_ = 0, hd_ = 0;
  unsigned char* host_ = nullptr;  // pinned
  size_t host_bytes_ = 0, per_layer_ = 0;  // layer l's parameters at l * per_layer_ + group.off
  DevBuf dev_;
};

// Layer l of one sequence's step: stores its nb new K/V rows and attends its nb
// queries. kk [nb, KD] rotated at the keys' positions (plain caches), kraw the
// same keys before RoPE (KIVI), vv [nb, KD]; q [nb, nh * hd] un-rotated, qcs
// [nb, 2, hd] the query tables (angle_a / angle_b); out [nb, nh * hd]. kcs
// [nb, hd]: when given, kk is not rotated yet and a plain cache's append
// rotates it (one launch less).
void attend_layer(const CudaCache& cc, int64_t l, const float* kk, const float* kraw, const float* vv, const float* q,
                  const float* qcs, int64_t first, int64_t nb, int nh, float scale, float* out, float* part,
                  cudaStream_t s, const float* kcs = nullptr);

}  // namespace ptllm::cuda
