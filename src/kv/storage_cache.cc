#include "kv/storage_cache.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/memory.h"
#include "ops/ops.h"

namespace ptllm {
namespace {
// Queries from which attend() transposes the keys (a prefill chunk): the
// transposition costs about as much as one query's scores.
constexpr int64_t kTransposedMinQueries = 16;
}  // namespace

StorageKVCache::StorageKVCache(const KVCacheShape& s, const CacheSpec& o) : KVCache(s), opt_(o) {
  o.check();  // the one validation of a spec: every cache is made here
  if (s.capacity < 1) fail("KV cache: capacity {} (expected >= 1)", s.capacity);
  if (s.head_dim % 2 != 0 || s.head_dim > kMaxHeadDim)
    fail("KV cache: head_dim {} (expected even and <= {})", s.head_dim, kMaxHeadDim);
  if (s.n_kv_heads < 1 || s.n_heads % s.n_kv_heads != 0)
    fail("KV cache: {} query heads is not a multiple of {} KV heads", s.n_heads, s.n_kv_heads);
  // Sinks are only full-precision "sinks" in a StreamingLLM cache.
  const int64_t sink = o.streaming() ? o.sink : 0;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    k_.push_back(make_store(true, o, sink, s.n_kv_heads, s.capacity, s.head_dim));
    v_.push_back(make_store(false, o, sink, s.n_kv_heads, s.capacity, s.head_dim));
    pos_.emplace_back();
    pos_.back().reserve(size_t(s.capacity));
  }
  // Quantised keys are stored un-rotated in both RoPE modes (per-channel
  // statistics of pre-RoPE keys are stable; rotated ones mix channel pairs by
  // position) and rotated at read time by their slot. Other keys are stored
  // rotated at their absolute position. Either way the query is rotated per
  // run of slots so that the score has the angle the RoPE mode asks for (attend()).
  // Rotated keys (M R(pos) k) and per-token quantised keys are stored after
  // RoPE like plain keys: a rotation mixes the rotate-half pairs, so read-time
  // RoPE could no longer be folded into the codes, and a per-token scale does
  // not need stable channel statistics.
  const bool token_keys = o.grouped() && is_quantised(o.k_storage()) && o.k_axis == KeyAxis::Token;
  keys_prerope_ = is_quantised(o.k_storage()) && o.rotate == KVRotate::None && !token_keys;
  if (o.rotate == KVRotate::Hadamard) {
    if (!HadamardRotation::valid_size(s.head_dim))
      throw CacheSpecError(SpecIssue{"rotate", "hadamard",
                                     fmt::format("none for this model: head_dim {} is not a power of two", s.head_dim),
                                     {}});
    for (int64_t l = 0; l < s.n_layers; ++l)
      for (int64_t h = 0; h < s.n_kv_heads; ++h)
        rot_.emplace_back(s.head_dim, 0x5eed0000ull + uint64_t(l * 4096 + h));  // fixed seed per (layer, head)
  }
  // Read-back buffers for one layer, sized once so memory stays flat while decoding.
  // Only for stores that are not read in place: an fp32 or grouped KIVI cache
  // has none (so no idle 2 x [n_kv_heads, capacity, head_dim] floats).
  const size_t staged = size_t(s.n_kv_heads * s.capacity * s.head_dim);
  if (!k_.empty() && !k_[0]->reads_in_place()) kbuf_.resize(staged);
  if (!v_.empty() && !v_[0]->reads_in_place()) vbuf_.resize(staged);
}

void StorageKVCache::ensure_slot_table(int64_t len) {
  const int64_t half = shape_.head_dim / 2, have = int64_t(cos_.size()) / std::max<int64_t>(half, 1);
  if (len <= have) return;
  const int64_t n = std::min(shape_.capacity, std::max(len, 2 * have));
  cos_.resize(size_t(n * half));
  sin_.resize(cos_.size());
  for (int64_t t = have; t < n; ++t) rope_.cos_sin(double(t), &cos_[size_t(t * half)], &sin_[size_t(t * half)]);
}

void StorageKVCache::append(int64_t layer, const float* k, const float* v, int64_t n) {
  const auto& s = shape_;
  // A layer with its own attention window (Mistral, YOCO self-decoder) never
  // again needs keys that the oldest query of this step cannot see: drop them,
  // so while decoding such a layer holds at most `window` entries. Only a
  // prefix goes, so slots stay contiguous and re-positioned RoPE keeps the true
  // query-key distances.
  const int64_t window = s.window_of(layer);
  if (window > 0 && !bounded()) {
    auto& p = pos_[size_t(layer)];
    int64_t drop = 0;
    while (drop < int64_t(p.size()) && p[size_t(drop)] <= position_ - window) ++drop;
    if (drop > 0) {
      k_[size_t(layer)]->evict(0, drop);
      v_[size_t(layer)]->evict(0, drop);
      p.erase(p.begin(), p.begin() + drop);
    }
  }
  const int64_t len = stored(layer);
  if (len + n > s.capacity) {
    if (!bounded())
      fail("KV cache full: {} stored + {} new > capacity {}", len, n, s.capacity);
    if (n > 1)
      fail("KV cache: {} tokens in one step would overflow the StreamingLLM bound of {} (room() is {})", n,
           s.capacity, room());
    // Exactly the slots that appending first and then dropping [N, len+1-M) would remove.
    const int64_t begin = opt_.sink, end = len + n - opt_.window;
    k_[size_t(layer)]->evict(begin, end);
    v_[size_t(layer)]->evict(begin, end);
    auto& p = pos_[size_t(layer)];
    p.erase(p.begin() + begin, p.begin() + end);
  }
  const int64_t row = s.n_kv_heads * s.head_dim;
  if (!keys_prerope_) {
    // Keys keep the rotation of their original position (then, rotate
    // hadamard, M per head: k' = M R(pos) k).
    std::vector<float> rk(k, k + n * row);
    // A prefill's rows in parallel (each row's rotation is its own).
#pragma omp parallel for schedule(static) if (n > 1 && n * row >= ops::parallel_min_work())
    for (int64_t t = 0; t < n; ++t) rope_.apply(rk.data() + t * row, s.n_kv_heads, double(position_ + t));
    if (!rot_.empty())
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < s.n_kv_heads; ++h) rotation(layer, h)->forward(rk.data() + t * row + h * s.head_dim);
    k_[size_t(layer)]->append(rk.data(), n);
  } else {
    k_[size_t(layer)]->append(k, n);
  }
  if (!rot_.empty()) {
    // v' = M v; attention sums p_t v'_t = M (sum p_t v_t) and attend() turns it back by M^T.
    std::vector<float> rv(v, v + n * row);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < s.n_kv_heads; ++h) rotation(layer, h)->forward(rv.data() + t * row + h * s.head_dim);
    v_[size_t(layer)]->append(rv.data(), n);
  } else {
    v_[size_t(layer)]->append(v, n);
  }
  for (int64_t t = 0; t < n; ++t) pos_[size_t(layer)].push_back(position_ + t);
}

void StorageKVCache::attend(int64_t layer, const float* q, int64_t n, float* out) {
  const auto& s = shape_;
  const int64_t len = stored(layer), hd = s.head_dim, half = hd / 2, KVH = s.n_kv_heads;
  const int64_t group = s.n_heads / KVH, first = len - n;  // slot of query 0
  if (first < 0) fail("KV cache: attend over {} queries but layer {} holds {} tokens", n, layer, len);
  const bool reposition = opt_.rope_mode == RopeMode::Reposition;
  const KVStore& ks = *k_[size_t(layer)];
  const KVStore& vs = *v_[size_t(layer)];
  const int64_t* kp = pos_[size_t(layer)].data();
  const int64_t window = s.window_of(layer);

  // RoPE by rotating the query once per run of slots with a constant offset
  // off = position - slot (StreamingLLM: the sinks have off 0, the window the
  // number of evicted tokens; a prefix-dropped window layer one offset).
  // With R(a)q . R(b)k = q . R(b - a)k and the angle the mode wants,
  //   reposition: slot_k - slot_q,   absolute: pos_k - pos_q,
  // a key stored rotated at pos_k (fp32/fp16/bf16) needs the query at
  //   reposition: slot_q + off,      absolute: pos_q,
  // and a pre-RoPE key rotated at read time by its slot (quantised) needs
  //   reposition: slot_q,            absolute: pos_q - off.
  // So no stored key is ever re-rotated and eviction moves nothing.
  struct Run {
    int64_t begin, end, off;
  };
  // Only plain keys under reposition and quantised keys under absolute use
  // `off`; otherwise one run covers every slot.
  std::vector<Run> runs;
  if (reposition != keys_prerope_) {
    for (int64_t t = 0; t < len; ++t) {
      const int64_t off = kp[t] - t;
      if (runs.empty() || runs.back().off != off)
        runs.push_back({t, t + 1, off});
      else
        runs.back().end = t + 1;
    }
  } else if (len > 0) {
    runs.push_back({0, len, 0});
  }
  const int64_t nr = int64_t(runs.size());
  // Positions rise with the slot (appends add later positions after earlier
  // ones; eviction removes slots, never reorders): then each query's mask is
  // a prefix (its window) and no per-slot test is needed.
  bool increasing = true;
  for (int64_t t = 1; t < len && increasing; ++t) increasing = kp[t] > kp[t - 1];
  std::vector<float> qcos(static_cast<size_t>(n * nr * half)), qsin(qcos.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t slot_q = first + i, pos_q = position_ + i, off = runs[size_t(r)].off;
      const int64_t angle = keys_prerope_ ? (reposition ? slot_q : pos_q - off) : (reposition ? slot_q + off : pos_q);
      rope_.cos_sin(double(angle), &qcos[size_t((i * nr + r) * half)], &qsin[size_t((i * nr + r) * half)]);
    }
  if (keys_prerope_) ensure_slot_table(len);

  // A prefill over keys stored rotated scores its queries against each KV
  // head's keys transposed once, kt [KVH][hd, ld] (ops::dot_rows_transposed:
  // lanes over keys, no horizontal sum per key, each key column loaded once
  // for kMultiQueries queries). Chosen by the number of queries alone, and a
  // prompt's chunks depend only on the prompt, so a request's results still
  // do not depend on what else runs. ld leaves room for the kernel's whole
  // 16-key blocks from any run's first slot.
  // Only for keys read as fp32 rows (stored fp32, or staged); grouped KIVI
  // keys keep their fused kernels.
  const bool transposed = !keys_prerope_ && n >= kTransposedMinQueries && len > 0 &&
                          (!ks.reads_in_place() || opt_.k_storage() == KVStorage::F32);
  const int64_t ld = transposed ? (len + 15) / 16 * 16 + 16 : 0;
  // The calling thread's, reused: it grows to the longest layer a prefill
  // chunk met (one layer's keys, 1 / (2 * layers) of an fp32 cache's bytes)
  // and stays, so a server's memory reaches its high-water mark once.
  thread_local std::vector<float> kt_buf;
  if (transposed) kt_buf.resize(size_t(KVH * hd * ld));
  float* const kt_all = transposed ? kt_buf.data() : nullptr;

  // Phase 1, parallel over KV heads: stores that attention cannot read in
  // place (fp16/bf16, the simple KIVI scheme) are read back as fp32 into
  // kbuf_/vbuf_, pre-RoPE keys rotated by slot; a prefill transposes the
  // keys. fp32 stores are otherwise read in place and grouped KIVI stores by
  // the fused kernels (nothing is dequantised).
  const bool k_staged = !ks.reads_in_place(), v_staged = !vs.reads_in_place();
  if (k_staged || v_staged || transposed) {
#pragma omp parallel for schedule(static) if (KVH > 1 && KVH * len * hd >= ops::parallel_min_work())
    for (int64_t h = 0; h < KVH; ++h) {
      if (k_staged) {
        float* kb = kbuf_.data() + h * s.capacity * hd;
        ks.read(h, kb);
        if (keys_prerope_)
          for (int64_t t = 0; t < len; ++t) rope_.apply(kb + t * hd, 1, &cos_[size_t(t * half)], &sin_[size_t(t * half)]);
      }
      if (v_staged) vs.read(h, vbuf_.data() + h * s.capacity * hd);
      if (transposed) {
        thread_local std::vector<float> rows_buf;
        const float* rows = kbuf_.data() + h * s.capacity * hd;
        if (!k_staged) {
          rows_buf.resize(size_t(len * hd));
          ks.read(h, rows_buf.data());
          rows = rows_buf.data();
        }
        float* kt = kt_all + h * hd * ld;
        for (int64_t d = 0; d < hd; ++d) {
          float* col = kt + d * ld;
          for (int64_t t = 0; t < len; ++t) col[t] = rows[t * hd + d];
          std::fill(col + len, col + ld, 0.f);
        }
      }
    }
  }
  const float* kcos = keys_prerope_ ? cos_.data() : nullptr;
  const float* ksin = keys_prerope_ ? sin_.data() : nullptr;

  // Phase 2, parallel over (query, head): softmax attention. Scores and the
  // weighted sum come from the stores (one virtual call per run of slots).
  // Cyclic (static, 1): query i reads first + i + 1 slots, so contiguous
  // chunks would give the last thread ~3/4 of a causal prefill's work.
  const int64_t qstride = s.n_heads * hd;
  const float scale = 1.0f / std::sqrt(float(hd));
  // Scores and weighted sum: ~2 multiply-adds per (query, head, slot, dim).
  // A decode step over a short cache is a few thousand: one thread, no
  // wake-up of the others (each (query, head) is computed whole by one
  // thread either way, so the split does not change the result).
  const bool parallel = 2 * n * s.n_heads * len * hd >= ops::parallel_min_work();
  // A work item is up to kQ (query, head) pairs whose value sums run in one
  // kernel call, each sum identical to value_sum's:
  //  - several queries (a prefill chunk): kQ consecutive queries of one head,
  //    sharing each value row's loads (value_sum_multi);
  //  - one query (a decode step): consecutive heads, whose FMA chains
  //    interleave (one head's sum alone waits on the FMA latency at every
  //    slot); heads of one KV group share rows as above, others go through
  //    value_sum_heads. As many heads per item as keeps every thread of the
  //    region busy, up to kQ: all kQ on one thread (a batched step runs each
  //    sequence's attention on one thread inside its own region), one per
  //    item where there are as many threads as heads.
  constexpr int kQ = ops::kMultiQueries;
  const bool by_heads = n == 1;
  const int threads = parallel && !omp_in_parallel() ? std::max(omp_get_max_threads(), 1) : 1;
  const int64_t heads_per_item = by_heads ? std::clamp<int64_t>(s.n_heads / threads, 1, kQ) : 1;
  const int64_t n_items = by_heads ? (s.n_heads + heads_per_item - 1) / heads_per_item : (n + kQ - 1) / kQ * s.n_heads;
#pragma omp parallel if (parallel)
  {
    const int64_t sstride = transposed ? ld : std::max<int64_t>(len, 1);
    std::vector<float> qr(static_cast<size_t>(kQ * hd)), scores(static_cast<size_t>(kQ * sstride));
#pragma omp for schedule(static, 1)
    for (int64_t item = 0; item < n_items; ++item) {
      // The item's pairs: query i0 + j of head h0 (+ j when by heads).
      const int64_t i0 = by_heads ? 0 : (item / s.n_heads) * kQ;
      const int64_t h0 = by_heads ? item * heads_per_item : item % s.n_heads;
      const int m = int(by_heads ? std::min(heads_per_item, s.n_heads - h0) : std::min<int64_t>(kQ, n - i0));
      const auto query_of = [&](int j) { return by_heads ? i0 : i0 + j; };
      const auto head_of = [&](int j) { return by_heads ? h0 + j : h0; };
      const auto kv_stage = [&](bool staged, const auto& buf, int64_t kvh) -> const float* {
        return staged ? buf.data() + kvh * s.capacity * hd : nullptr;
      };
      // Query i of head h after its RoPE for run r (and M where keys are M R(pos) k).
      const auto rotated_query = [&](int64_t i, int64_t h, int64_t r, float* dst) {
        std::copy_n(q + i * qstride + h * hd, hd, dst);
        rope_.apply(dst, 1, &qcos[size_t((i * nr + r) * half)], &qsin[size_t((i * nr + r) * half)]);
        if (const HadamardRotation* rot = rotation(layer, h / group)) rot->forward(dst);
      };
      if (transposed) {
        // (Several queries, so one head.) The block's queries together, per
        // run, up to the last one's slots (columns past a query's own are
        // never read: softmax stops at its len, value_sum_multi sees 0 there).
        const int64_t li_max = first + i0 + m, kvh = h0 / group;
        const float* qp[kQ];
        float* sp[kQ];
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t b = runs[size_t(r)].begin, e = std::min(runs[size_t(r)].end, li_max);
          if (b >= e) break;
          for (int j = 0; j < m; ++j) {
            rotated_query(i0 + j, h0, r, qr.data() + j * hd);
            qp[j] = qr.data() + j * hd;
            sp[j] = scores.data() + j * sstride + b;
          }
          ops::dot_rows_transposed(qp, m, kt_all + kvh * hd * ld + b, ld, e - b, hd, scale, sp);
        }
      }
      float* ps[kQ];
      int64_t lens[kQ], kvhs[kQ];
      float* outs[kQ];
      int active = 0;
      for (int j = 0; j < m; ++j) {
        const int64_t i = query_of(j), h = head_of(j), kvh = h / group;
        float* o = out + i * qstride + h * hd;
        float* sc = scores.data() + j * sstride;
        // Causal by slot: query i sees slots 0..first+i.
        const int64_t li = first + i + 1, q_pos = kp[first + i];
        if (!transposed)
          for (int64_t r = 0; r < nr; ++r) {
            const int64_t b = runs[size_t(r)].begin, e = std::min(runs[size_t(r)].end, li);
            if (b >= e) break;
            rotated_query(i, h, r, qr.data());
            ks.key_scores(kvh, kv_stage(k_staged, kbuf_, kvh), qr.data(), b, e, kcos, ksin, scale, sc);
          }
        bool any = false;
        if (increasing) {
          // Slots up to the query's own hold positions <= q_pos; the window
          // hides a prefix of them.
          const int64_t lo = window > 0 ? int64_t(std::upper_bound(kp, kp + li, q_pos - window) - kp) : 0;
          std::fill(sc, sc + lo, -INFINITY);
          any = lo < li;
        } else {
          for (int64_t t = 0; t < li; ++t) {
            const int64_t p = kp[t];
            if (p <= q_pos && (window <= 0 || p > q_pos - window))
              any = true;
            else
              sc[t] = -INFINITY;
          }
        }
        if (!any) {
          std::fill(o, o + hd, 0.f);
          continue;
        }
        ops::softmax(sc, li);
        ps[active] = sc;
        lens[active] = li;
        kvhs[active] = kvh;
        outs[active++] = o;
      }
      if (active == 0) continue;
      // The value sums read every p over the longest len: 0 past a query's own.
      const int64_t longest = *std::max_element(lens, lens + active);
      for (int j = 0; j < active; ++j) std::fill(ps[j] + lens[j], ps[j] + longest, 0.f);
      if (std::all_of(kvhs, kvhs + active, [&](int64_t x) { return x == kvhs[0]; })) {
        vs.value_sum_multi(kvhs[0], kv_stage(v_staged, vbuf_, kvhs[0]), ps, lens, active, outs);
      } else {
        const float* vstages[kQ];
        for (int j = 0; j < active; ++j) vstages[j] = kv_stage(v_staged, vbuf_, kvhs[j]);
        vs.value_sum_heads(kvhs, vstages, ps, longest, active, outs);
      }
      for (int j = 0; j < active; ++j)
        if (const HadamardRotation* rot = rotation(layer, kvhs[j])) rot->inverse(outs[j]);  // o = M^T (sum p_t M v_t)
    }
  }
}

int64_t StorageKVCache::room() const {
  int64_t used = 0;
  for (auto& k : k_) used = std::max(used, k->size());
  const int64_t free = shape_.capacity - used;
  // A full StreamingLLM cache still takes one token per step (it evicts to make room).
  return bounded() ? std::max<int64_t>(free, 1) : free;
}

size_t StorageKVCache::payload_bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += k_[l]->payload_bytes() + v_[l]->payload_bytes();
  return b;
}

size_t StorageKVCache::scale_bytes() const {
  size_t b = 0;
  for (size_t l = 0; l < k_.size(); ++l) b += k_[l]->scale_bytes() + v_[l]->scale_bytes();
  return b;
}

std::string StorageKVCache::describe() const {
  return fmt::format("{} · {} slots per layer", opt_.describe(), shape_.capacity);
}

void StorageKVCache::populate() {
  for (auto* stores : {&k_, &v_})
    for (auto& st : *stores) st->populate();
  populate_pages(kbuf_.data(), kbuf_.size() * sizeof(float));
  populate_pages(vbuf_.data(), vbuf_.size() * sizeof(float));
  // The slot table would otherwise grow (and be computed) by doubling during decode.
  if (keys_prerope_) ensure_slot_table(shape_.capacity);
}

void StorageKVCache::clear() {
  KVCache::clear();
  for (auto& k : k_) k->clear();
  for (auto& v : v_) v->clear();
  for (auto& p : pos_) p.clear();
}

std::vector<float> StorageKVCache::read_keys(int64_t layer, int64_t head) const {
  std::vector<float> out(static_cast<size_t>(stored(layer) * shape_.head_dim));
  k_[size_t(layer)]->read(head, out.data());
  return out;
}

std::vector<float> StorageKVCache::read_values(int64_t layer, int64_t head) const {
  std::vector<float> out(static_cast<size_t>(stored(layer) * shape_.head_dim));
  v_[size_t(layer)]->read(head, out.data());
  return out;
}

}  // namespace ptllm
