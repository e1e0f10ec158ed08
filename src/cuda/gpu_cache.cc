// The GPU KV cache (gpu_cache.h): allocation, the host-side slot and grouped
// KIVI bookkeeping (the CPU stores' counters, replayed), and one layer's
// append + attention as kernel launches.
#include "cuda/gpu_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "cuda/probe.h"

namespace ptllm::cuda {
namespace {

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

}  // namespace

CudaCache::CudaCache(std::shared_ptr<Engine> eng, const KVCacheShape& s, const CacheSpec& spec)
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

int64_t CudaCache::room() const {
  const int64_t free = shape_.capacity - len_;
  return bounded() ? std::max<int64_t>(free, 1) : free;
}

// As the CPU stores count them (kv/grouped_store.cc payload_bytes / scale_bytes).
size_t CudaCache::payload_bytes() const {
  const size_t L = size_t(shape_.n_layers), kvh = size_t(shape_.n_kv_heads), hd = size_t(shape_.head_dim);
  if (!kivi_) return 2 * size_t(len_) * L * kvh * hd * size_t(k::elem_bytes(e_));
  return 2 * L * (size_t(st_.n_sink + st_.n_res) * kvh * hd * size_t(k::elem_bytes(re_)) +
                  size_t(st_.n_quant) * kvh * row_);
}

size_t CudaCache::scale_bytes() const {
  if (!kivi_) return 0;
  const size_t L = size_t(shape_.n_layers), kvh = size_t(shape_.n_kv_heads);
  return L * kvh * 4 * (size_t(st_.n_groups * shape_.head_dim) + size_t(st_.n_quant));
}

std::string CudaCache::describe() const {
  return fmt::format("{} · {} slots per layer · on the GPU", spec_.describe(), shape_.capacity);
}

void CudaCache::clear() {
  KVCache::clear();
  len_ = 0;
  ring_start_ = 0;
  evicted_ = 0;
  st_ = post_ = KState{};
  ops_.clear();
}

size_t CudaCache::device_bytes() const {
  size_t n = 0;
  for (const DevBuf* b : {&k_, &v_, &kcodes_, &vcodes_, &kpar_, &vpar_, &ksink_, &vsink_, &kres_, &vres_, &kcs_})
    n += b->bytes;
  return n;
}

cudaStream_t CudaCache::stream() const { return eng_ ? engine_stream(*eng_) : cudaStreamLegacy; }

void CudaCache::copy_from(const KVCache& other) {
  const auto* o = dynamic_cast<const CudaCache*>(&other);
  if (!o || o->eng_ != eng_) fail("GPU cache copy: the source is not a GPU cache of this model");
  const KVCacheShape &a = shape_, &b = o->shape_;
  if (a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads || a.head_dim != b.head_dim ||
      a.capacity != b.capacity || spec_.describe() != o->spec_.describe())
    fail("GPU cache copy: the source has another shape or settings ({} vs {})", o->describe(), describe());
  for (auto [d, s] : {std::pair{&k_, &o->k_}, {&v_, &o->v_}, {&kcodes_, &o->kcodes_}, {&vcodes_, &o->vcodes_},
                      {&kpar_, &o->kpar_}, {&vpar_, &o->vpar_}, {&ksink_, &o->ksink_}, {&vsink_, &o->vsink_},
                      {&kres_, &o->kres_}, {&vres_, &o->vres_}})
    if (s->bytes) check(cudaMemcpyAsync(d->p, s->p, s->bytes, cudaMemcpyDeviceToDevice, stream()), "cache copy");
  // On the stream the steps run on, so that the next step reads the copy, not what was there;
  // without an engine, waited for here (nothing else orders it).
  if (!eng_) check(cudaStreamSynchronize(stream()), "cache copy");
  position_ = o->position_;
  ring_start_ = o->ring_start_;
  len_ = o->len_;
  evicted_ = o->evicted_;
  st_ = o->st_;
  post_ = o->post_;
  ops_ = o->ops_;
}

int64_t CudaCache::begin_step(int64_t n) {
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

k::PlainLayer CudaCache::layer(int64_t l) const {
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

void CudaCache::kivi_append(int64_t l, const float* k, const float* v, cudaStream_t s) const {
  const int64_t row = shape_.n_kv_heads * shape_.head_dim;
  for (const KOp& op : ops_) {
    const k::KiviLayer c = kivi_layer(l, op.before);
    if (op.flush)
      k::kivi_flush(c, int(op.qdst), int(op.rsrc), int(op.gslot), s);
    else
      k::kivi_append(c, k + op.src * row, v + op.src * row, int(op.n), op.to_sink, int(op.dst), s);
  }
}

k::AppendKiviB CudaCache::kivi_append_param(int64_t l, const float* k, const float* v) const {
  if (ops_.empty() || ops_[0].flush || ops_[0].n != 1)
    fail("GPU cache: a batched append needs a plan of one new token");
  const KOp& op = ops_[0];
  k::AppendKiviB p;
  p.c = kivi_layer(l, op.before);
  p.k = k;
  p.v = v;
  p.dst = int(op.dst);
  p.to_sink = op.to_sink ? 1 : 0;
  return p;
}

void CudaCache::kivi_flushes(int64_t l, cudaStream_t s) const {
  for (size_t i = 1; i < ops_.size(); ++i) {
    const KOp& op = ops_[i];
    if (!op.flush) fail("GPU cache: a batched step plans one append");
    k::kivi_flush(kivi_layer(l, op.before), int(op.qdst), int(op.rsrc), int(op.gslot), s);
  }
}

void CudaCache::init_kivi() {
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
  // Slot table: slot t's key rotation (cos, sin of angle t), as StorageKVCache::ensure_slot_table,
  // stored [hd/2, cap] of (cos, sin) pairs: the decode kernel's lanes run over slots, so the
  // 32 slots of a warp read one pair i from 256 consecutive bytes.
  std::vector<float> cs(size_t(cap * hd)), c1(size_t(hd / 2)), s1(size_t(hd / 2));
  for (int64_t t = 0; t < cap; ++t) {
    rope().cos_sin(double(t), c1.data(), s1.data());
    for (int64_t i = 0; i < hd / 2; ++i) {
      cs[size_t((i * cap + t) * 2)] = c1[size_t(i)];
      cs[size_t((i * cap + t) * 2 + 1)] = s1[size_t(i)];
    }
  }
  kcs_.reserve(cs.size() * 4);
  // On the steps' stream: from pageable memory the call returns once `cs` is staged (so it may
  // go out of scope), and the kernels that read the table come after it on the same stream.
  check(cudaMemcpyAsync(kcs_.p, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice, stream()), "slot table");
  if (!eng_) check(cudaStreamSynchronize(stream()), "slot table");
}

k::KiviLayer CudaCache::kivi_layer(int64_t l, const KState& st) const {
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
void CudaCache::kivi_evict(int64_t drop) {
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
void CudaCache::kivi_plan(int64_t n) {
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

namespace {
// The fields both attention launches share.
template <typename A>
void fill_attend(A& a, const CudaCache& cc, const float* q, const float* qcs, int64_t first, int64_t nb, int nh,
                 float scale, float* out, float* part) {
  const int len = int(first + nb);
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
}
}  // namespace

void attend_layer(const CudaCache& cc, int64_t l, const float* kk, const float* kraw, const float* vv, const float* q,
                  const float* qcs, int64_t first, int64_t nb, int nh, float scale, float* out, float* part,
                  cudaStream_t s, const float* kcs) {
  if (cc.kivi()) {
    cc.kivi_append(l, kraw, vv, s);
    k::AttendKivi a;
    a.c = cc.kivi_layer(l);
    a.kcs = cc.slot_table();
    fill_attend(a, cc, q, qcs, first, nb, nh, scale, out, part);
    k::attend_kivi(a, s);
    return;
  }
  k::Attend a;
  a.c = cc.layer(l);
  k::append_plain(a.c, kk, vv, int(nb), int(first), s, kcs);
  fill_attend(a, cc, q, qcs, first, nb, nh, scale, out, part);
  k::attend_plain(a, s);
}

BatchAttend::BatchAttend() = default;
BatchAttend::~BatchAttend() {
  if (host_) cudaFreeHost(host_);
}

namespace {
int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

std::atomic<int> g_kind{-1}, g_nt{-1};  // testing::set_kivi_decode
}  // namespace

namespace testing {
void set_kivi_decode(const KiviDecodeOverride& o) {
  g_kind = o.kind;
  g_nt = o.tiles_per_split;
}
}  // namespace testing

namespace k {
KiviDecPlan kivi_dec_plan(int hd, int nh, int kvh, Elem re, int bits, int64_t max_len, int64_t B) {
  // PTLLM_CUDA_KIVI_DEC: 0 the general kernel always, 1 / 2 that kind, unset: by shape (kernels.h).
  static const int env_kind = env_int("PTLLM_CUDA_KIVI_DEC", -1);
  static const int env_nt = env_int("PTLLM_CUDA_KIVI_NT", 0);
  static const int n_sm = [] {
    int d = 0, c = 0;
    if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, d) != cudaSuccess)
      return 132;
    return c;
  }();
  const int kind = g_kind >= 0 ? g_kind.load() : env_kind;
  const int want_nt = g_nt > 0 ? g_nt.load() : env_nt;
  KiviDecPlan p;
  p.chunk = kivi_chunk(1);
  const int grp = kvh > 0 ? nh / kvh : 0;
  const bool shape = kvh > 0 && nh % kvh == 0 && (hd == 64 || hd == 128) && (grp == 1 || grp == 2 || grp == 4 || grp == 8);
  if (!shape || kind == 0) return p;
  p.kind = 1;
  p.chunk = kKiviDecChunk;
  // Blocks of the tiled kernel the GPU holds at once, per (storage, bits, head_dim, group).
  static std::atomic<int> resident_of[3][3][2][4];  // 0: not asked yet
  const int ie = re == Elem::F32 ? 0 : re == Elem::F16 ? 1 : 2, ib = bits == 8 ? 0 : bits == 4 ? 1 : 2;
  const int ig = grp == 1 ? 0 : grp == 2 ? 1 : grp == 4 ? 2 : 3;
  std::atomic<int>& slot = resident_of[ie][ib][hd == 128][ig];
  if (slot == 0) slot = std::max(1, kivi_tile_blocks_per_sm(re, bits, hd, grp)) * n_sm;
  const int64_t resident = slot;
  const int64_t tiles = (std::max<int64_t>(max_len, 1) + kKiviDecChunk - 1) / kKiviDecChunk;
  const int64_t units = tiles * kvh * std::max<int64_t>(B, 1);  // one-tile blocks
  if (kind == 1 || (kind != 2 && (bits == 8 || units < 2 * resident))) return p;
  int64_t nt = want_nt;
  if (nt <= 0) {
    int64_t best = -1;
    for (int64_t t = 2; t <= 32; ++t) {
      const int64_t blocks = (tiles + t - 1) / t * kvh * std::max<int64_t>(B, 1);
      if (blocks < resident && best > 0) break;  // fewer blocks than the GPU holds: SMs idle
      const int64_t cost = (blocks + resident - 1) / resident * t;
      if (best < 0 || cost <= best) {
        best = cost;
        nt = t;
      }
    }
  }
  p.kind = 2;
  p.chunk = int(std::max<int64_t>(nt, 1)) * kKiviDecChunk;
  return p;
}
}  // namespace k

void BatchAttend::plan(CudaCache* const* caches, int64_t B, const int64_t* first, int64_t n_layers, int nh,
                       float scale, const float* kk, const float* kraw, const float* vv, const float* q,
                       const float* qcs, float* out, float* part, int64_t part_stride, cudaStream_t s,
                       const float* kcs) {
  caches_ = caches;
  const KVCacheShape& sh = caches[0]->shape();
  nh_ = nh;
  kvh_ = int(sh.n_kv_heads);
  hd_ = int(sh.head_dim);
  const int64_t KD = sh.n_kv_heads * sh.head_dim, QD = int64_t(nh) * sh.head_dim, hd = sh.head_dim;
  groups_.clear();
  for (int64_t b = 0; b < B; ++b) {
    const CudaCache& c = *caches[b];
    Group* g = nullptr;
    for (Group& x : groups_)
      if (x.kivi == c.kivi() && (c.kivi() ? x.e == c.residual_elem() && x.bits == c.bits() : x.e == c.elem()))
        g = &x;
    if (!g) {
      groups_.emplace_back();
      g = &groups_.back();
      g->kivi = c.kivi();
      g->e = c.kivi() ? c.residual_elem() : c.elem();
      g->bits = c.kivi() ? c.bits() : 0;
    }
    g->seqs.push_back(b);
    g->max_len = std::max(g->max_len, first[b] + 1);
  }
  for (Group& g : groups_) {
    if (g.kivi) g.plan = k::kivi_dec_plan(hd_, nh, kvh_, g.e, g.bits, g.max_len, int64_t(g.seqs.size()));
    const int64_t chunk = g.kivi ? g.plan.chunk : 256;
    g.S = int((g.max_len + chunk - 1) / chunk);
  }
  const auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  size_t per_layer = 0;
  for (Group& g : groups_) {
    const size_t n = g.seqs.size();
    g.app_bytes = align(n * (g.kivi ? sizeof(k::AppendKiviB) : sizeof(k::AppendPlainB)));
    g.att_bytes = align(n * (g.kivi ? sizeof(k::AttendKivi) : sizeof(k::Attend)));
    g.off = per_layer;
    per_layer += g.app_bytes + g.att_bytes;
  }
  const size_t total = per_layer * size_t(n_layers);
  if (host_bytes_ < total) {
    if (host_) cudaFreeHost(host_);
    host_ = nullptr;
    check(cudaHostAlloc(reinterpret_cast<void**>(&host_), total, cudaHostAllocDefault), "pinned buffer");
    host_bytes_ = total;
  }
  // The previous step's upload must be done before the host buffer is rewritten.
  check(cudaStreamSynchronize(s), "batch plan");
  for (int64_t l = 0; l < n_layers; ++l) {
    unsigned char* base = host_ + size_t(l) * per_layer;
    for (const Group& g : groups_) {
      unsigned char* app = base + g.off;
      unsigned char* att = app + g.app_bytes;
      for (size_t j = 0; j < g.seqs.size(); ++j) {
        const int64_t b = g.seqs[j];
        const CudaCache& c = *caches[b];
        const int64_t len = first[b] + 1;
        const auto fill = [&](auto& a) {
          a.q = q + b * QD;
          a.qcs = qcs + b * 2 * hd;
          a.n = 1;
          a.nh = nh;
          a.len = int(len);
          a.first = int(first[b]);
          a.run_split = int(std::min<int64_t>(c.run_split(), len));
          a.scale = scale;
          a.out = out + b * QD;
          a.part = part + b * part_stride;
        };
        if (g.kivi) {
          const k::AppendKiviB p = c.kivi_append_param(l, kraw + b * KD, vv + b * KD);
          std::memcpy(app + j * sizeof(p), &p, sizeof(p));
          k::AttendKivi a;
          a.c = c.kivi_layer(l);
          a.kcs = c.slot_table();
          fill(a);
          std::memcpy(att + j * sizeof(a), &a, sizeof(a));
        } else {
          k::AppendPlainB p;
          p.c = c.layer(l);
          p.k = kk + b * KD;
          p.v = vv + b * KD;
          p.kcs = kcs ? kcs + b * hd : nullptr;
          p.first = int(first[b]);
          std::memcpy(app + j * sizeof(p), &p, sizeof(p));
          k::Attend a;
          a.c = p.c;
          fill(a);
          std::memcpy(att + j * sizeof(a), &a, sizeof(a));
        }
      }
    }
  }
  dev_.reserve(total);
  check(cudaMemcpyAsync(dev_.p, host_, total, cudaMemcpyHostToDevice, s), "batch plan upload");
  per_layer_ = per_layer;
}

void BatchAttend::launch_key(std::vector<int64_t>& key) const {
  key.push_back(int64_t(reinterpret_cast<uintptr_t>(dev_.p)));
  key.push_back(int64_t(per_layer_));
  for (const Group& g : groups_)
    key.insert(key.end(), {int64_t(g.kivi), int64_t(g.e), g.bits, int64_t(g.seqs.size()), g.S, g.plan.kind,
                           g.plan.chunk, int64_t(g.off), int64_t(g.app_bytes)});
}

void BatchAttend::run_layer(int64_t l, cudaStream_t s) const {
  const unsigned char* base = static_cast<const unsigned char*>(dev_.p) + size_t(l) * per_layer_;
  for (const Group& g : groups_) {
    const int B = int(g.seqs.size());
    const unsigned char* app = base + g.off;
    const unsigned char* att = app + g.app_bytes;
    if (g.kivi) {
      k::kivi_append_batch(reinterpret_cast<const k::AppendKiviB*>(app), B, kvh_, g.e, s);
      for (int64_t b : g.seqs) caches_[b]->kivi_flushes(l, s);
      k::attend_kivi_batch(reinterpret_cast<const k::AttendKivi*>(att), B, nh_, kvh_, hd_, g.S, g.plan, g.e, g.bits, s);
    } else {
      k::append_plain_batch(reinterpret_cast<const k::AppendPlainB*>(app), B, kvh_, g.e, s);
      k::attend_plain_batch(reinterpret_cast<const k::Attend*>(att), B, nh_, hd_, g.S, g.e, s);
    }
  }
}

}  // namespace ptllm::cuda
