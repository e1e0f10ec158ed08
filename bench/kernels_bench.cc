// Micro-benchmarks of the hot kernels of a decode step and of the machine's
// memory bandwidth (the physical floor a memory-bound decode is measured against).
//
//   build-perf/bench/kernels_bench --benchmark_filter=Matvec
//
// Shapes are flagship-27m's: hidden 256, ffn 768, vocab 32000, 8 heads x 32.
// "bytes_per_second" is weight (or cache) bytes read per second.
#include <benchmark/benchmark.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/finite.h"
#include "core/tensor.h"
#if defined(__x86_64__)
#include "ops/simd_util.h"
#endif
#include "kv/cache_spec.h"
#include "kv/grouped_store.h"
#include "ops/kivi_kernels.h"
#include "ops/ops.h"
#include "sampling/sampler.h"
#include "bench_util.h"

namespace {

using namespace ptllm;

using bench::randn;
using bench::Weights;

// Args: out rows, in, threads.
template <DType D>
void BM_Matvec(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1);
  ops::set_num_threads(int(st.range(2)));
  Weights w(D, out, in);
  auto x = randn(size_t(in), 1);
  std::vector<float> y(static_cast<size_t>(out));
  for (auto _ : st) {
    ops::matmul(w.view, x.data(), 1, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(w.view.nbytes()));
}
void MatvecArgs(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2})
    for (auto [o, i] : {std::pair{256, 256}, {768, 256}, {256, 768}, {32000, 256}}) b->Args({o, i, t});
  b->ArgNames({"out", "in", "threads"})->UseRealTime();
}
BENCHMARK(BM_Matvec<DType::F32>)->Apply(MatvecArgs);
BENCHMARK(BM_Matvec<DType::BF16>)->Apply(MatvecArgs);
BENCHMARK(BM_Matvec<DType::F16>)->Apply(MatvecArgs);

// Prefill-shaped matmul: Args out, in, tokens, threads. Reports GFLOP/s.
template <DType D>
void BM_Matmul(benchmark::State& st) {
  const int64_t out = st.range(0), in = st.range(1), n = st.range(2);
  ops::set_num_threads(int(st.range(3)));
  Weights w(D, out, in);
  auto x = randn(size_t(n * in), 1);
  std::vector<float> y(size_t(n * out));
  for (auto _ : st) {
    ops::matmul(w.view, x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(double(st.iterations()) * 2.0 * double(out * in * n) / 1e9,
                                              benchmark::Counter::kIsRate);
}
void MatmulArgs(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2})
    for (auto [o, i] : {std::pair{256, 256}, {768, 256}, {256, 768}}) b->Args({o, i, 512, t});
  b->ArgNames({"out", "in", "tokens", "threads"})->UseRealTime();
}
BENCHMARK(BM_Matmul<DType::F32>)->Apply(MatmulArgs);
BENCHMARK(BM_Matmul<DType::BF16>)->Apply(MatmulArgs);
BENCHMARK(BM_Matmul<DType::F16>)->Apply(MatmulArgs);

// One decode step's attention for one layer (8 heads x 32, flagship) over T
// stored tokens. Args: T, storage (KVStorage index), rope mode (0 reposition,
// 1 absolute). bytes_per_second counts the cache bytes (payload + scales).
void BM_Attention(benchmark::State& st) {
  const int64_t T = st.range(0);
  CacheSpec o;
  o.storage = KVStorage(st.range(1));
  o.rope_mode = st.range(2) ? RopeMode::Absolute : RopeMode::Reposition;
  ops::set_num_threads(1);
  KVCacheShape s;
  s.n_layers = 1;
  s.n_heads = s.n_kv_heads = 8;
  s.head_dim = 32;
  s.capacity = T;
  auto cache = make_cache(s, o);
  const int64_t D = s.n_kv_heads * s.head_dim;
  // Fill in chunks (the way prefill does), then append the query's own token.
  for (int64_t done = 0; done < T - 1;) {
    const int64_t n = std::min<int64_t>(512, T - 1 - done);
    auto k = randn(size_t(n * D), uint64_t(done) + 1), v = randn(size_t(n * D), uint64_t(done) + 2);
    cache->append(0, k.data(), v.data(), n);
    cache->advance(n);
    done += n;
  }
  auto k = randn(size_t(D), 90), v = randn(size_t(D), 91), q = randn(size_t(D), 92);
  cache->append(0, k.data(), v.data(), 1);
  std::vector<float> out(static_cast<size_t>(D));
  for (auto _ : st) {
    cache->attend(0, q.data(), 1, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(cache->payload_bytes() + cache->scale_bytes()));
  st.SetLabel(std::string(storage_name(o.storage)) + (st.range(2) ? " absolute" : " reposition"));
}
BENCHMARK(BM_Attention)
    ->ArgsProduct({{256, 1024, 4096, 8192}, {int(KVStorage::F32), int(KVStorage::F16), int(KVStorage::Int8),
                                             int(KVStorage::Int4), int(KVStorage::Int2)}, {0, 1}})
    ->ArgNames({"T", "storage", "absolute"});

// Grouped KIVI (de)quantisation, flagship shapes (8 heads x 32): appending
// tokens to a K (per-channel, arg 1 = 0) or V (per-token, arg 1 = 1) store,
// which quantises one group of 32 every 32 tokens; and reading a 4,096-token
// store back as fp32 (what the fused kernels avoid; used by tests and read()).
// Arg 0: bits (8, 4, 2). items = tokens.
void BM_KiviAppend(benchmark::State& st) {
  const int bits = int(st.range(0));
  const bool values = st.range(1) != 0;
  const kivi::QuantRange r = bits == 8 ? kivi::kInt8Range : bits == 4 ? kivi::kInt4Range : kivi::kInt2Range;
  const int64_t H = 8, D = 32, T = 4096;
  GroupedKiviStore store(values ? GroupedKiviStore::Axis::PerToken : GroupedKiviStore::Axis::PerChannel, r, H, T, D,
                         4, 32, 128);
  const auto x = randn(size_t(T * H * D), 5);
  int64_t t = 0;
  for (auto _ : st) {
    if (t == T) {
      st.PauseTiming();
      store.clear();
      t = 0;
      st.ResumeTiming();
    }
    store.append(x.data() + t * H * D, 1);
    ++t;
  }
  st.SetItemsProcessed(int64_t(st.iterations()));
}
BENCHMARK(BM_KiviAppend)->ArgsProduct({{8, 4, 2}, {0, 1}})->ArgNames({"bits", "values"});

void BM_KiviRead(benchmark::State& st) {
  const int bits = int(st.range(0));
  const kivi::QuantRange r = bits == 8 ? kivi::kInt8Range : bits == 4 ? kivi::kInt4Range : kivi::kInt2Range;
  const int64_t H = 8, D = 32, T = 4096;
  GroupedKiviStore store(GroupedKiviStore::Axis::PerChannel, r, H, T, D, 4, 32, 128);
  const auto x = randn(size_t(T * H * D), 6);
  store.append(x.data(), T);
  std::vector<float> out(size_t(T * D));
  for (auto _ : st) {
    for (int64_t h = 0; h < H; ++h) store.read(h, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T * H * D);
}
BENCHMARK(BM_KiviRead)->Arg(8)->Arg(4)->Arg(2)->ArgName("bits");

// The fused KIVI kernels alone (ops/kivi_kernels.h) on one head of 4,096
// quantised tokens, hd 32: scores of a query against every group of 32 (arg 1
// = 0) or the weighted sum of the values (arg 1 = 1). Arg 0: bits. items = tokens.
void BM_KiviKernel(benchmark::State& st) {
  const int bits = int(st.range(0));
  const bool values = st.range(1) != 0;
  const kivi::QuantRange r = bits == 8 ? kivi::kInt8Range : bits == 4 ? kivi::kInt4Range : kivi::kInt2Range;
  const int64_t T = 4096, hd = 32, G = 32;
  std::vector<uint8_t> codes(size_t(T) * kivi::row_bytes(hd, r));
  std::mt19937_64 g(7);
  for (auto& c : codes) c = uint8_t(g());
  std::vector<kivi::AffineParams> params(size_t(T * hd), {kivi::Half::nearest(0.05f), kivi::Half::nearest(-0.3f)});
  ops::KiviCodes view;
  view.base = codes.data();
  view.row_bytes = kivi::row_bytes(hd, r);
  view.cap = T;
  view.start = 100;  // a ring that wraps
  view.head_dim = hd;
  view.range = r;
  const auto q = randn(size_t(hd), 1), cs = randn(size_t(T * hd / 2), 2), sn = randn(size_t(T * hd / 2), 3);
  std::vector<float> scores(static_cast<size_t>(T), 1.f / float(T)), out(static_cast<size_t>(hd));
  for (auto _ : st) {
    if (values) {
      ops::kivi_value_sum(view, 0, T, params.data(), scores.data(), out.data());
      benchmark::DoNotOptimize(out.data());
    } else {
      for (int64_t t = 0; t < T; t += G)
        ops::kivi_key_scores(view, t, G, params.data() + t, q.data(), 0.17f, cs.data() + t * hd / 2,
                             sn.data() + t * hd / 2, scores.data() + t);
      benchmark::DoNotOptimize(scores.data());
    }
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
}
BENCHMARK(BM_KiviKernel)->ArgsProduct({{8, 4, 2}, {0, 1}})->ArgNames({"bits", "values"});

// One head's softmax attention over T fp32 rows (hd 32): per-key dot_f32/axpy
// calls (Arg 1 = 0) against the blocked dot_rows/weighted_sum_rows (Arg 1 = 1).
void BM_AttendHead(benchmark::State& st) {
  const int64_t T = st.range(0), hd = 32;
  const bool blocked = st.range(1) != 0;
  auto q = randn(size_t(hd), 1), k = randn(size_t(T * hd), 2), v = randn(size_t(T * hd), 3);
  std::vector<float> scores(static_cast<size_t>(T)), out(static_cast<size_t>(hd));
  const float scale = 1.f / std::sqrt(float(hd));
  for (auto _ : st) {
    std::fill(out.begin(), out.end(), 0.f);
    if (blocked) {
      ops::dot_rows(q.data(), k.data(), T, hd, scale, scores.data());
    } else {
      for (int64_t t = 0; t < T; ++t) scores[size_t(t)] = ops::dot_f32(q.data(), k.data() + t * hd, hd) * scale;
    }
    ops::softmax(scores.data(), T);
    if (blocked) {
      ops::weighted_sum_rows(scores.data(), v.data(), T, hd, out.data());
    } else {
      for (int64_t t = 0; t < T; ++t) ops::axpy(scores[size_t(t)], v.data() + t * hd, out.data(), hd);
    }
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * T);
}
BENCHMARK(BM_AttendHead)->ArgsProduct({{256, 1024, 4096, 8192}, {0, 1}})->ArgNames({"T", "blocked"});

void BM_SiluMul(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto g = randn(size_t(n), 1), u = randn(size_t(n), 2), w = g;
  for (auto _ : st) {
    std::memcpy(w.data(), g.data(), size_t(n) * 4);
    ops::silu_mul(w.data(), u.data(), n);
    benchmark::DoNotOptimize(w.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * n);
}
BENCHMARK(BM_SiluMul)->Arg(768)->Arg(768 * 512);

void BM_Softmax(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto x = randn(size_t(n), 1), w = x;
  for (auto _ : st) {
    std::memcpy(w.data(), x.data(), size_t(n) * 4);
    ops::softmax(w.data(), n);
    benchmark::DoNotOptimize(w.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * n);
}
BENCHMARK(BM_Softmax)->Arg(256)->Arg(4096);

// One token drawn from n logits (sampling/sampler.h), as a server step does per
// sequence: kind 0 temperature 0.8 (every token a candidate), 1 the same with top-p 0.9,
// 2 top-k 40, 3 greedy. Logits ~ N(0, 3^2), about a trained model's spread.
void BM_Sample(benchmark::State& st) {
  const int64_t n = st.range(0), kind = st.range(1);
  auto x = randn(size_t(n), 3);
  for (float& v : x) v *= 3;
  SamplerConfig c;
  c.temperature = kind == 3 ? 0.0 : 0.8;
  if (kind == 1) c.top_p = 0.9;
  if (kind == 2) c.top_k = 40;
  c.seed = 1;
  Sampler s(c);
  for (auto _ : st) benchmark::DoNotOptimize(s.sample(x));
  st.SetItemsProcessed(int64_t(st.iterations()) * n);
}
BENCHMARK(BM_Sample)->ArgsProduct({{32000, 128256}, {0, 1, 2, 3}})->ArgNames({"n", "kind"});

// The logits check of a batch step (core/finite.h) over n floats, against the loop it
// replaced (std::isfinite with an exit at the first bad value, which does not vectorise)
// and a copy of the same bytes; n = 64 x 128,256 is a batch of 64 at Llama 3's vocabulary
// (docs/CUDA.md, "Session 22"). kind 0: all_finite, 1: the previous loop, 2: memcpy.
void BM_LogitsCheck(benchmark::State& st) {
  const int64_t n = st.range(0), kind = st.range(1);
  auto x = randn(size_t(n), 1), y = x;
  for (auto _ : st) {
    bool ok = true;
    if (kind == 0) ok = all_finite(x.data(), n);
    if (kind == 1)
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(x[size_t(i)])) {
          ok = false;
          break;
        }
    if (kind == 2) std::memcpy(y.data(), x.data(), size_t(n) * 4);
    benchmark::DoNotOptimize(ok);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * n * 4);
}
BENCHMARK(BM_LogitsCheck)
    ->ArgsProduct({{128256, 64 * 128256}, {0, 1, 2}})
    ->ArgNames({"n", "kind"})
    ->Unit(benchmark::kMillisecond);

// ---------- memory bandwidth ----------
// Buffers of 53 MB (flagship's weights: fits the last-level cache), 512 MiB
// and 1 GiB (do not). Args: bytes, threads, prefetch (1 = each line through
// detail::prefetch_stream, as the decode kernels do since session 21; 2048 or
// 4096 = that many bytes ahead into L1 only, as they did before; 0 = the
// hardware prefetchers alone). The best 2-thread figure over the large
// buffers is "the measured read bandwidth" the decode goals are judged by.
std::vector<float>& buffer(size_t bytes, int which) {
  static std::vector<float> bufs[2];
  auto& b = bufs[which];
  if (b.size() * 4 != bytes) {
    b.assign(bytes / 4, 1.0f);
  }
  return b;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float read_sum_avx512(const float* p, size_t n, size_t prefetch) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    if (prefetch == 1) {
      for (int l = 0; l < 4; ++l) ptllm::ops::detail::prefetch_stream(reinterpret_cast<const char*>(p + i) + 64 * l);
    } else if (prefetch) {
      for (int l = 0; l < 4; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + i) + prefetch + 64 * l, _MM_HINT_T0);
    }
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}
__attribute__((target("avx2"))) float read_sum_avx2(const float* p, size_t n, size_t prefetch) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (prefetch == 1) {
      for (int l = 0; l < 2; ++l) ptllm::ops::detail::prefetch_stream(reinterpret_cast<const char*>(p + i) + 64 * l);
    } else if (prefetch) {
      for (int l = 0; l < 2; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + i) + prefetch + 64 * l, _MM_HINT_T0);
    }
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += p[i];
  return s;
}
// The widest loads this CPU has (an AVX2-only machine must not run AVX-512).
float read_sum(const float* p, size_t n, size_t prefetch) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 ? read_sum_avx512(p, n, prefetch) : read_sum_avx2(p, n, prefetch);
}
#else
// Elsewhere: four independent sums the compiler vectorises (NEON on arm64).
float read_sum(const float* p, size_t n, size_t /*prefetch*/) {
  float a[4] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) a[j] += p[i + j];
  float s = a[0] + a[1] + a[2] + a[3];
  for (; i < n; ++i) s += p[i];
  return s;
}
#endif

void BM_ReadBandwidth(benchmark::State& st) {
  const size_t bytes = size_t(st.range(0));
  const int threads = int(st.range(1));
  auto& b = buffer(bytes, 0);
  const size_t n = b.size();
  for (auto _ : st) {
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t lo = n * size_t(t) / size_t(nt), hi = n * size_t(t + 1) / size_t(nt);
      total += read_sum(b.data() + lo, hi - lo, size_t(st.range(2)));
    }
    benchmark::DoNotOptimize(total);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(bytes));
}
BENCHMARK(BM_ReadBandwidth)
    ->ArgsProduct({{53 << 20, 512 << 20, 1 << 30}, {1, 2}, {0, 1, 2048, 4096}})
    ->ArgNames({"bytes", "threads", "prefetch"})
    ->UseRealTime();

// The machine's int8 compute ceiling, the floor's counterpart for prefill:
// 12 independent chains of vpdpbusd (u8 x s8 -> i32, 4 multiply-adds per
// 32-bit lane) per thread, from registers. "MACs" counts multiply-adds, so a
// product's GFLOP/s (quant_bench) is at most 2x this. kind 0: 512-bit
// dpbusd; 1: 512-bit FMA (to see whether the two share their ports); 2: six
// of each, interleaved; 3: the 12 dpbusd plus 6 independent vpmulld (Q4_K's
// sub-block scales); 4: the 12 dpbusd plus 6 int -> float converts and 6 ands
// (the 16-row kernels' conversion and unpacking); 5: the 12 dpbusd plus 6 x
// (shift, and, convert, fp32 add), 24 such instructions. Kinds 3-5 are
// written in assembly (the compiler moved and spilled registers around them)
// and count only their dpbusd, so a rate below kind 0's is what the other
// instructions take from the dpbusd. Runs only where AVX-512 VNNI exists.
#if defined(__x86_64__)
template <int kKind>
__attribute__((target("avx512f,avx512vnni"))) int64_t vnni_chains(int64_t reps) {
  __m512i a[12];
  __m512 f[12];
  for (int i = 0; i < 12; ++i) {
    a[i] = _mm512_set1_epi32(i);
    f[i] = _mm512_set1_ps(float(i));
  }
  __m512i u = _mm512_set1_epi8(3), w = _mm512_set1_epi8(5);
  __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  for (int64_t n = 0; n < reps; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      if (kKind == 0 || (kKind == 2 && i % 2 == 0)) a[i] = _mm512_dpbusd_epi32(a[i], u, w);
      else f[i] = _mm512_fmadd_ps(f[i], x, y);
    }
    asm volatile("" : "+v"(u), "+v"(x));  // keeps the loop from being folded
  }
  alignas(64) int32_t ai[16];
  alignas(64) float fi[16];
  int64_t sink = 0;
  for (int i = 0; i < 12; ++i) {
    _mm512_store_si512(ai, a[i]);
    _mm512_store_ps(fi, f[i]);
    sink += ai[0] + int64_t(fi[0]);
  }
  return sink;
}
#define PTLLM_D12                                                                                   \
  "vpdpbusd %%zmm20, %%zmm21, %%zmm0\n vpdpbusd %%zmm20, %%zmm21, %%zmm1\n"                          \
  "vpdpbusd %%zmm20, %%zmm21, %%zmm2\n vpdpbusd %%zmm20, %%zmm21, %%zmm3\n"                          \
  "vpdpbusd %%zmm20, %%zmm21, %%zmm4\n vpdpbusd %%zmm20, %%zmm21, %%zmm5\n"                          \
  "vpdpbusd %%zmm20, %%zmm21, %%zmm6\n vpdpbusd %%zmm20, %%zmm21, %%zmm7\n"                          \
  "vpdpbusd %%zmm20, %%zmm21, %%zmm8\n vpdpbusd %%zmm20, %%zmm21, %%zmm9\n"                          \
  "vpdpbusd %%zmm20, %%zmm21, %%zmm10\n vpdpbusd %%zmm20, %%zmm21, %%zmm11\n"
#define PTLLM_CVT_AND(r)                                                                            \
  "vcvtdq2ps %%zmm22, %%zmm" #r "\n vpandd %%zmm22, %%zmm21, %%zmm" #r "\n"
#define PTLLM_MIX(r)                                                                                \
  "vpsrld $1, %%zmm22, %%zmm" #r "\n vpandd %%zmm22, %%zmm" #r ", %%zmm" #r "\n"                   \
  "vcvtdq2ps %%zmm" #r ", %%zmm" #r "\n vaddps %%zmm22, %%zmm" #r ", %%zmm" #r "\n"
__attribute__((target("avx512f,avx512vnni"))) void port_mix(int kind, int64_t reps) {
  // zmm0-11: the dpbusd chains; zmm12-17: the other instructions' results,
  // each from the loop-invariant zmm20-22 (independent of the last pass).
  __asm__ volatile("vpternlogd $0xff, %%zmm22, %%zmm22, %%zmm22\n vpsrld $1, %%zmm22, %%zmm22\n" ::: "xmm22");
  if (kind == 3)
    __asm__ volatile(
        "1:\n" PTLLM_D12
        "vpmulld %%zmm20, %%zmm22, %%zmm12\n vpmulld %%zmm20, %%zmm22, %%zmm13\n"
        "vpmulld %%zmm20, %%zmm22, %%zmm14\n vpmulld %%zmm20, %%zmm22, %%zmm15\n"
        "vpmulld %%zmm20, %%zmm22, %%zmm16\n vpmulld %%zmm20, %%zmm22, %%zmm17\n"
        "dec %0\n jnz 1b\n"
        : "+r"(reps)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
          "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
  else if (kind == 4)
    __asm__ volatile("1:\n" PTLLM_D12 PTLLM_CVT_AND(12) PTLLM_CVT_AND(13) PTLLM_CVT_AND(14) PTLLM_CVT_AND(15)
                         PTLLM_CVT_AND(16) PTLLM_CVT_AND(17) "dec %0\n jnz 1b\n"
                     : "+r"(reps)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                       "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
  else
    __asm__ volatile("1:\n" PTLLM_D12 PTLLM_MIX(12) PTLLM_MIX(13) PTLLM_MIX(14) PTLLM_MIX(15) PTLLM_MIX(16)
                         PTLLM_MIX(17) "dec %0\n jnz 1b\n"
                     : "+r"(reps)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                       "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
}
#undef PTLLM_D12
#undef PTLLM_MIX
#undef PTLLM_CVT_AND

void BM_ComputePeak(benchmark::State& st) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    st.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  const int kind = int(st.range(0)), threads = int(st.range(1));
  constexpr int64_t kReps = 1 << 22;
  int64_t sink = 0;
  for (auto _ : st) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    if (kind >= 3) port_mix(kind, kReps);
    else sink += kind == 0 ? vnni_chains<0>(kReps) : kind == 1 ? vnni_chains<1>(kReps) : vnni_chains<2>(kReps);
    benchmark::DoNotOptimize(sink);
  }
  // Kinds 0-2: the 12 chained instructions; 3-5: their 12 dpbusd.
  const double instr = double(st.iterations()) * double(threads) * double(kReps) * 12;
  st.counters["Ginstr"] = benchmark::Counter(instr / 1e9, benchmark::Counter::kIsRate);
  // Multiply-adds: a 512-bit dpbusd does 64, a 512-bit FMA 16.
  st.counters["GMACs"] = benchmark::Counter(
      instr / 1e9 * (kind == 1 ? 16.0 : kind == 2 ? 40.0 : 64.0), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ComputePeak)->ArgsProduct({{0, 1, 2, 3, 4, 5}, {1, 2}})->ArgNames({"kind", "threads"})->UseRealTime();
#endif

// memcpy: bytes_per_second counts the bytes copied (each is read once and written once).
void BM_CopyBandwidth(benchmark::State& st) {
  const size_t bytes = size_t(st.range(0));
  const int threads = int(st.range(1));
  auto& src = buffer(bytes, 0);
  auto& dst = buffer(bytes, 1);
  for (auto _ : st) {
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t lo = bytes * size_t(t) / size_t(nt) / 64 * 64, hi = bytes * size_t(t + 1) / size_t(nt) / 64 * 64;
      std::memcpy(reinterpret_cast<char*>(dst.data()) + lo, reinterpret_cast<const char*>(src.data()) + lo, hi - lo);
    }
    benchmark::DoNotOptimize(dst.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(bytes));
}
BENCHMARK(BM_CopyBandwidth)
    ->ArgsProduct({{53 << 20, 512 << 20}, {1, 2}})
    ->ArgNames({"bytes", "threads"})
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
