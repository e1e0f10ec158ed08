// The CUDA backend (issue 17): `--device cuda`. activate() uploads a model's
// weights to the GPU and routes make_cache (kv/cache_spec.h) to GPU caches, so
// every Decoder, perplexity run, bench and batch step of that model then runs
// on the GPU through Model::forward / forward_batch (model/device_cache.h).
//
// Built with PTLLM_CUDA=ON (backend.cu); otherwise stub.cc, whose activate()
// fails with a one-line error. Supported now: Llama-family models (Llama,
// Mistral/Qwen2 without a sliding window, qkv biases), no YOCO; KV storage
// fp32 / fp16 / bf16 and grouped KIVI int8 / int4 / int2 (docs/CUDA.md), unbounded
// or StreamingLLM sink + window (reposition or absolute RoPE).
#pragma once
#include <string>

namespace ptllm {
class Model;
}

namespace ptllm::cuda {

// How the weights are held on the GPU. Auto: as stored (bf16 / f16 files stay
// bf16 / f16, everything else fp32). Arithmetic is fp32 in every case, except that
// a decode batch of 16+ sequences with bf16/f16 weights rounds the activations to
// the weight type for its cuBLAS GEMM (fp32 accumulation; gemm.h, docs/CUDA.md).
enum class WeightType { Auto, F32, BF16, F16 };
// Parses "auto", "f32", "bf16", "f16"; throws Error naming `flag` otherwise.
WeightType parse_weight_type(const std::string& text, const std::string& flag);

// How the GPU engine computes, beyond its weights.
struct EngineOptions {
  // Each sequence's logits bit for bit the same whatever else is in its step (the CPU
  // engine's guarantee, docs/SERVER.md "Batch invariance"): every projection through the
  // row-wise GEMV kernel, whose sums for one row do not depend on how many rows the launch
  // has (no one-row kernels, no cuBLAS GEMM), and attention launched per sequence, whose
  // splits depend on that sequence's length alone. Slower at batch 1 and from 16 sequences
  // (docs/CUDA.md, "Session 29"). Off: a row in a step of 2+ sequences differs from the same
  // row alone in its last bits (one-row kernels, batched attention splits; the GEMM from 16).
  bool batch_invariant = false;
};

// True when this build has the CUDA backend.
bool built();
// Uploads `model`'s weights (kept alive until deactivate(); the model must
// outlive that) and makes make_cache build GPU caches for it. Throws Error when
// built without CUDA, when there is no GPU, or the model/cache is unsupported.
void activate(const Model& model, WeightType weights = WeightType::Auto, const EngineOptions& options = {});
// Back to CPU caches; frees the GPU weights once no cache uses them.
void deactivate();
// "NVIDIA H200 (sm_90, 139 GiB)" or the reason there is none.
std::string device_name();

}  // namespace ptllm::cuda
