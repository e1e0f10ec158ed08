// The GPU KV cache (gpu_cache.h): allocation, the host-side slot and grouped
// KIVI bookkeeping (the CPU stores' counters, replayed), and one layer's
// append + attention as kernel launches.
#include "cuda/gpu_cache.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

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
  // Slot table: slot t's key rotation (cos, sin of angle t), as StorageKVCache::ensure_slot_table.
  std::vector<float> cs(size_t(cap * hd));
  for (int64_t t = 0; t < cap; ++t) rope().cos_sin(double(t), &cs[size_t(t * hd)], &cs[size_t(t * hd + hd / 2)]);
  kcs_.reserve(cs.size() * 4);
  check(cudaMemcpy(kcs_.p, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice), "slot table");
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
                  cudaStream_t s) {
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
  k::append_plain(a.c, kk, vv, int(nb), int(first), s);
  fill_attend(a, cc, q, qcs, first, nb, nh, scale, out, part);
  k::attend_plain(a, s);
}

}  // namespace ptllm::cuda
