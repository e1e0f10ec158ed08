// GGUF models (architectures `llama` and `qwen2`): metadata -> ModelConfig,
// GGUF tensor names <-> the Hugging Face names the Model reads, and the Q/K
// row order. llama.cpp's converter permutes the rows of every `llama` wq/wk
// head from the rotate-half layout the HF model (and our RoPE) uses to the
// interleaved layout ggml's RoPE wants: within a head of head_dim rows, HF row
// half*(head_dim/2) + j goes to GGUF row 2*j + half. Loading undoes it; a
// permutation moves whole rows, so it works on block-quantised rows too.
// `qwen2` files are not permuted (llama.cpp runs them with NEOX RoPE).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/model.h"

namespace ptllm {

// {arch}.* metadata -> ModelConfig; throws Error naming the file and key.
ModelConfig gguf_model_config(const GgufFile& f);

// HF tensor name for a GGUF one ("blk.3.attn_q.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); "" for names the model does not use.
std::string hf_name_from_gguf(const std::string& gguf_name);
// The reverse ("lm_head.weight" -> "output.weight"); "" when unmapped.
std::string gguf_name_from_hf(const std::string& hf_name);

// Reorders the rows of a [n_heads*head_dim, cols] tensor (`row_bytes` each)
// between the HF and GGUF layouts. to_gguf = true applies llama.cpp's permute,
// false undoes it.
void permute_qk_rows(const std::byte* in, std::byte* out, int64_t n_heads, int64_t head_dim, size_t row_bytes,
                     bool to_gguf);

// A .gguf model. *file (when given) receives the parsed file, for the
// tokenizer (tokenizer.ggml.*); the Model keeps it in memory either way.
// `how`: map the file or read it into memory (io/mmap.h). relay: the
// matrices of a type whose 16-row layout has a kernel at the current SIMD
// level (ops::rows16_pays: Q8_0, Q4_0, Q4_K at AVX-512), rows a multiple of 16, are
// re-laid in place (core/dtype.h) where the memory is private (read in, or a
// copy this loader made: Q and K); a mapped file's other tensors stay as stored.
std::unique_ptr<Model> load_gguf_model(const std::string& path, std::shared_ptr<const GgufFile>* file = nullptr,
                                       FileLoad how = FileLoad::Map, bool relay = false);

}  // namespace ptllm
