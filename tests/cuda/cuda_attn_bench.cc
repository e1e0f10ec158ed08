// Micro-benchmark of the GPU decode attention alone (issue 17): one layer of a
// Llama-3.1-8B-shaped cache (8 KV heads, 32 query heads, head_dim 128) filled
// with D random tokens through the GPU cache's own append path (cuda/probe.h),
// then the attention of one new query timed over back-to-back launches (split
// kernel + combine, CUDA events). Reports the cache bytes the kernel must read
// (payload + scales, as the cache counts them; not the KIVI kernel's fp32 cos/sin
// table) per launch time, hot and with L2 evicted before each launch, and the device's
// copy bandwidth measured in the same process. Not a test (no ctest entry).
//
// usage: cuda_attn_bench [DEPTH ...]   (default 32768)
// PTLLM_BENCH_MODES=int4,int8 runs only those of fp16 / int8 / int4 / int2 (e.g. under ncu).
// The KIVI decode kernel follows PTLLM_CUDA_KIVI_DEC (cuda/kernels.h; kivi_dec_plan).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/device_buffer.h"
#include "cuda/probe.h"
#include "kv/cache_spec.h"

using namespace ptllm;

namespace {

double copy_gbps() {
  const size_t n = size_t(2) << 30;
  cuda::DevBuf a, b;
  a.reserve(n);
  b.reserve(n);
  cuda::check(cudaMemset(a.p, 1, n), "memset");
  cuda::check(cudaMemcpy(b.p, a.p, n, cudaMemcpyDeviceToDevice), "copy");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int r = 0; r < 10; ++r) cudaMemcpy(b.p, a.p, n, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  return 2.0 * double(n) * 10 / (double(ms) / 1e3) / 1e9;  // read + write
}

CacheSpec spec_of(const std::string& m) {
  CacheSpec s;
  s.storage = m == "fp16" ? KVStorage::F16 : m == "int8" ? KVStorage::Int8 : m == "int4" ? KVStorage::Int4
                                                                                          : KVStorage::Int2;
  return s;  // KIVI defaults: G32 R128, fp16 residual
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int64_t> depths;
  for (int i = 1; i < argc; ++i) depths.push_back(std::atoll(argv[i]));
  if (depths.empty()) depths = {32768};
  std::printf("{\"what\": \"copy_bandwidth\", \"GBps\": %.1f}\n", copy_gbps());
  const int64_t kvh = 8, nh = 32, hd = 128, KD = kvh * hd, QD = nh * hd;
  const char* only = std::getenv("PTLLM_BENCH_MODES");
  for (int64_t depth : depths)
    for (const char* mode : {"fp16", "int8", "int4", "int2"}) {
      if (only && *only && std::string(",") .append(only).append(",").find(std::string(",") + mode + ",") == std::string::npos)
        continue;
      KVCacheShape sh;
      sh.n_layers = 1;
      sh.n_heads = nh;
      sh.n_kv_heads = kvh;
      sh.head_dim = hd;
      sh.capacity = depth + 2;  // each time_attention appends one token
      sh.rope.theta = 500000.0;
      cuda::testing::LayerProbe p(sh, spec_of(mode));
      std::mt19937 rng(3);
      std::normal_distribution<float> nd;
      const int64_t chunk = 512;
      std::vector<float> k(size_t(chunk * KD)), v(k.size()), q(size_t(chunk * QD)), out(q.size());
      for (auto* b : {&k, &v, &q})
        for (auto& x : *b) x = nd(rng);
      for (int64_t t = 0; t < depth;) {
        const int64_t n = std::min(chunk, depth - t);
        p.step(k.data(), v.data(), q.data(), n, out.data());
        t += n;
      }
      // Hot: back-to-back launches (a one-layer cache of <= ~50 MB can sit in L2);
      // cold: L2 evicted by a 256 MB memset before each launch, each launch timed alone.
      const double hot = p.time_attention(k.data(), v.data(), q.data(), 200);
      const double cold = p.time_attention(k.data(), v.data(), q.data(), 100, size_t(256) << 20);
      const double bytes = double(p.payload_bytes() + p.scale_bytes());
      std::printf("{\"what\": \"decode_attention\", \"mode\": \"%s\", \"stored\": %lld, \"us_hot\": %.2f, "
                  "\"GBps_hot\": %.1f, \"us_cold\": %.2f, \"GBps_cold\": %.1f, \"cache_bytes\": %.0f}\n",
                  mode, (long long)(depth + 2), hot * 1e6, bytes / hot / 1e9, cold * 1e6, bytes / cold / 1e9, bytes);
      std::fflush(stdout);
    }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_attn_bench: %s\n", e.what());
  return 1;
}
