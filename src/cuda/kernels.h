// CUDA kernels of the GPU decode path (kernels.cu), behind plain C++
// signatures so the host code (backend.cc) compiles with the C++ compiler.
// All activations are fp32 row-major; weights and cache rows are fp32, fp16
// or bf16 and are widened to fp32 before any arithmetic.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace ptllm::cuda::k {

enum class Elem { F32, F16, BF16 };
inline int elem_bytes(Elem e) { return e == Elem::F32 ? 4 : 2; }

// dst[0..n) = src as `e` (round to nearest even).
void convert(const float* src, Elem e, void* dst, int64_t n, cudaStream_t s);
// x[t, :] = E[ids[t], :] widened; E [vocab, H].
void embed(Elem e, const void* E, const int32_t* ids, int n, int H, float* x, cudaStream_t s);
// out[t] = x[t] / rms(x[t]) * w, x/out [n, H].
void rmsnorm(const float* x, const float* w, float eps, int n, int H, float* out, cudaStream_t s);
// y[m, :] (+)= W x[m, :] + bias for m < M; W [N, K] row-major (an nn.Linear
// weight), x [M, K], y [M, N]. Each weight is read once per 8 rows.
// W must not be written by work still pending on the stream: the one-row kernels
// read their first weight chunk before waiting on the previous launch (programmatic
// dependent launch, kernels_common.cuh). Weights are uploaded and synchronized once.
// next: GemvPrefetch below.
struct GemvPrefetch;
// rows_alike: always the general kernel, whose sums for a row are the same at every M (the
// one-row kernels sum a row in another order than it would be summed among others).
void gemv(Elem e, const void* W, const float* x, const float* bias, float* y, int M, int N, int K, bool accumulate,
          cudaStream_t s, const GemvPrefetch* next = nullptr, bool rows_alike = false);
// Several projections of the same x in one launch: segment i is gemv(e, W, x,
// bias, y, M, N, K, accumulate) of its own fields (q, k and v of a layer).
struct GemvOut {
  const void* W = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
  int N = 0;
  bool accumulate = false;
};
constexpr int kMaxSegs = 3;
// An RMSNorm in front of a product: the product's input is rmsnorm(x[m, :]) * w (as
// rmsnorm() writes it) where x is the launch's x, the un-normalised rows. With w set,
// a one-row launch of 2-byte weights folds the norm into the GEMV (each warp sums x^2
// over its row itself: y = inv_rms * W (w * x), one launch instead of two); any other
// launch first writes rmsnorm(x) into scratch [M, K] and multiplies that. The two
// round differently (fp32 sums; tests/cuda, NormFoldedGemvMatchesSeparateNorm).
struct GemvNorm {
  const float* w = nullptr;
  float eps = 0;
  float* scratch = nullptr;
};
// Weights a later launch reads first, prefetched into L2 by a one-row launch: after its
// rows each warp issues one bulk prefetch (cp.async.bulk.prefetch.L2, sm_90) of its share
// of each range, so that DRAM keeps streaming through the launch's tail and through the
// latency-bound kernels after it (append, attention) instead of idling there. A hint: no
// result depends on it. p 16-byte aligned, bytes a multiple of 16 (else the range is skipped).
struct GemvPrefetch {
  const void* p[2] = {nullptr, nullptr};
  int64_t bytes[2] = {0, 0};
};
struct GemvSegs {
  GemvOut o[kMaxSegs];
  int n = 0;
  GemvNorm norm;       // none when norm.w is null
  GemvPrefetch next;   // none when both sizes are 0
  bool rows_alike = false;  // as gemv()'s
};
void gemv_multi(Elem e, const GemvSegs& segs, const float* x, int M, int K, cudaStream_t s);
// y[m, :] = silu(Wg x[m, :]) * (Wu x[m, :]), Wg and Wu [N, K]: the MLP's gate, up and
// silu_mul in one launch (each weight read once, as two gemv calls would); norm as above.
void gemv_swiglu(Elem e, const void* Wg, const void* Wu, const float* x, float* y, int M, int N, int K,
                 cudaStream_t s, const GemvNorm& norm = {}, const GemvPrefetch& next = {}, bool rows_alike = false);
// gemv() with an RMSNorm in front (GemvNorm above): the final norm and the LM head.
void gemv_normed(Elem e, const void* W, const float* x, const GemvNorm& norm, float* y, int M, int N, int K,
                 cudaStream_t s);
// Whether a launch of M rows of K with 2-byte weights `e` at x folds a GemvNorm into the
// GEMV itself (no rmsnorm launch), for tests and the step's launch count.
bool gemv_folds_norm(Elem e, int M, int K, const float* x);
// gate[i] = silu(gate[i]) * up[i].
void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t s);
// Rotate-half RoPE of x [n, nh, hd] by cs [n, hd] (cos of the hd/2 frequencies, then sin).
void rope(float* x, int n, int nh, int hd, const float* cs, cudaStream_t s);

// One layer's plain K or V cache rows: [kvh, cap, hd] of `e`. Slots: rows
// [0, sink_cap) are the sinks, the others a ring of ring_cap rows from ring_start
// (kv/kv_store.cc's PlainStore layout).
struct PlainLayer {
  void* k = nullptr;
  void* v = nullptr;
  Elem e = Elem::F16;
  int kvh = 0, cap = 0, hd = 0, sink_cap = 0, ring_start = 0, ring_cap = 0;
};
// Stores k, v [n, kvh, hd] at slots first .. first+n-1: k already rotated,
// or, with kcs ([n, hd] cos | sin rows, as rope() takes), rotated here (RoPE
// and the append in one launch, the same arithmetic as rope()).
void append_plain(const PlainLayer& c, const float* k, const float* v, int n, int first, cudaStream_t s,
                  const float* kcs = nullptr);

// Causal attention of n queries over slots [0, len) of one sequence: query i
// is at slot first + i and sees slots <= first + i. q [n, nh, hd] un-rotated;
// qcs [n, 2, hd]: the query's cos/sin for slots < run_split (A) and the rest (B)
// (StreamingLLM re-positioning: sinks and window differ by the evicted count).
// out [n, nh, hd]. part: scratch of attend_scratch_floats(n, nh, hd, len).
// (The queries' side, shared by the plain and the KIVI attention.)
struct AttendQuery {
  const float* q = nullptr;
  const float* qcs = nullptr;
  int n = 0, nh = 0, len = 0, first = 0, run_split = 0;
  float scale = 1;
  float* out = nullptr;
  float* part = nullptr;
};
struct Attend : AttendQuery {
  PlainLayer c;
};
int64_t attend_scratch_floats(int n, int nh, int hd, int len);
void attend_plain(const Attend& a, cudaStream_t s);

// ---- Grouped KIVI (kv/grouped_store.h on the GPU) ----
// One layer's grouped KIVI K and V, the CPU store's layout per KV head h:
//   slots [0, n_sink)            sinks: rows of `re` (fp32/fp16/bf16), ksink/vsink [kvh, sink_cap, hd]
//   slots [n_sink, +n_quant)     quantised tokens j = 0.. (oldest first): packed code rows
//                                kcodes/vcodes [kvh, cap, row] at physical row (qstart + j) mod cap
//   slots [.., +n_res)           residual rows of `re`, a ring kres/vres [kvh, res_cap, hd]: row j at
//                                (rstart + j) mod res_cap
// Codes: u = q - qmin packed as kv/quant.h (int4: element 2j low nibble of byte j; int2: element 4j+k
// in bits 2k..2k+1). Parameters are fp16 bit pairs (scale, zero), kivi::AffineParams:
//   K per (group, channel): kparams [kvh, gcap, hd, 2]; group g (0 = oldest live) at ring slot
//   (gstart + g) mod gcap; the oldest group holds g0 tokens (it may have lost some to eviction),
//   every later one G. V per token: vparams [kvh, cap, 2] at the token's physical code row.
// Keys are stored before RoPE; attention turns key slot t by the slot table kcs [hd/2, cap, 2]
// ((cos, sin) of frequency i at angle t at [i, t]), as StorageKVCache::attend does.
struct KiviLayer {
  uint8_t* kcodes = nullptr;
  uint8_t* vcodes = nullptr;
  uint16_t* kparams = nullptr;
  uint16_t* vparams = nullptr;
  void* ksink = nullptr;
  void* vsink = nullptr;
  void* kres = nullptr;
  void* vres = nullptr;
  Elem re = Elem::F16;
  int bits = 8;  // 8, 4 or 2
  int kvh = 0, cap = 0, hd = 0, row = 0, sink_cap = 0, res_cap = 0, gcap = 0, G = 0;
  // Bookkeeping (the same for every layer), as it is when the kernel runs.
  int n_sink = 0, n_quant = 0, n_res = 0, qstart = 0, rstart = 0, gstart = 0, g0 = 0;
};
// Stores k, v [n, kvh, hd] (pre-RoPE keys) as sink rows dst .. dst+n-1 (to_sink) or residual
// ring rows (dst + t) mod res_cap, rounded to c.re (fp16 saturated to +-65504, NaN -> 0, as the CPU).
void kivi_append(const KiviLayer& c, const float* k, const float* v, int n, bool to_sink, int dst, cudaStream_t s);
// Quantises the G residual rows from ring row rsrc: K per channel into group slot gslot, V per token;
// code rows qdst .. qdst+G-1 (mod cap). kv/grouped_store.cc flush_group's arithmetic exactly.
void kivi_flush(const KiviLayer& c, int qdst, int rsrc, int gslot, cudaStream_t s);
// attend_plain over a KIVI layer: scores from codes + full-precision rows, softmax, weighted sum of
// V codes + rows. Same split/combine and scratch as attend_plain.
struct AttendKivi : AttendQuery {
  KiviLayer c;
  const float* kcs = nullptr;  // [hd/2, cap, 2] slot table
};
void attend_kivi(const AttendKivi& a, cudaStream_t s);

// ---- Batched decode: B sequences of one token each, one launch per kernel ----
// Per-sequence parameters live in device memory (an array of B structs); all
// sequences of one launch share the storage kind (plain: c.e; KIVI: c.re and
// c.bits), kvh, nh and hd. The attention structs have n = 1 and their own q, qcs,
// out and part (S splits: S >= every sequence's split count; a sequence's unused
// splits write empty partials, so `part` holds nh * S * (hd + 2) floats each).
struct AppendPlainB {
  PlainLayer c;
  const float* k = nullptr;  // [kvh, hd], rotated unless kcs is given
  const float* v = nullptr;
  // [hd]: cos | sin at the key's position (as rope() takes a row): the append rotates k
  // with rope()'s arithmetic (RoPE and the append in one launch); null: k is rotated.
  const float* kcs = nullptr;
  int first = 0;
};
void append_plain_batch(const AppendPlainB* d, int B, int kvh, Elem e, cudaStream_t s);
void attend_plain_batch(const Attend* d, int B, int nh, int hd, int S, Elem e, cudaStream_t s);
struct AppendKiviB {
  KiviLayer c;               // bookkeeping before the append
  const float* k = nullptr;  // [kvh, hd] pre-RoPE
  const float* v = nullptr;
  int dst = 0, to_sink = 0;
};
void kivi_append_batch(const AppendKiviB* d, int B, int kvh, Elem re, cudaStream_t s);
// How a decode step (one query per sequence) over KIVI caches is split and which
// kernel runs it (head_dim 64 / 128 and 1, 2, 4 or 8 query heads per KV head; other
// shapes take kind 0, the general kernel with 64-slot splits):
//   kind 2: attend_kivi_tile_kernel, splits of chunk = NT x kKiviDecChunk slots walked
//     a tile at a time with an online softmax.
//   kind 1: the session-7 kernel, one 128-slot split per block.
// By default (docs/CUDA.md, Session 14) kind 2 for int4 and int2 where the launch has
// at least two waves of one-tile blocks (a long sequence, a large batch), with the NT
// in [2, 32] that needs the fewest tile-times (waves of resident blocks x NT; on a tie
// the larger NT, and at least one full wave of blocks); else kind 1, which is faster
// per tile (72 registers against 168, so more blocks per SM: at 8K stored tokens, one
// sequence, 44 us against 48-55 on the H200; int8 at 32K 123 us against 145-158).
// PTLLM_CUDA_KIVI_DEC=1 or 2 forces
// that kind, 0 the general kernel for every shape; PTLLM_CUDA_KIVI_NT sets NT.
// (Session 8's two-slots-per-thread kernel measured slower and was removed in
// session 9: docs/CUDA.md.) max_len: the longest sequence of the launch (slots its
// query sees), B its sequences. (kivi_dec_plan is host code in gpu_cache.cc.)
struct KiviDecPlan {
  int kind = 0, chunk = 64;
};
KiviDecPlan kivi_dec_plan(int hd, int nh, int kvh, Elem re, int bits, int64_t max_len, int64_t B);
// Blocks of the tiled kernel one SM holds for these keys (0: not that kernel's shape).
int kivi_tile_blocks_per_sm(Elem re, int bits, int hd, int grp);
constexpr int kKiviDecChunk = 128;  // kinds 1 and 2: slots per tile (one per thread)
int kivi_chunk(int n);  // the general kernel's slots per split for n queries
// S counts splits of plan.chunk slots (plan from kivi_dec_plan over the launch's sequences).
void attend_kivi_batch(const AttendKivi* d, int B, int nh, int kvh, int hd, int S, const KiviDecPlan& plan, Elem re,
                       int bits, cudaStream_t s);

}  // namespace ptllm::cuda::k
