#include "model/random_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <numbers>

#include "core/error.h"
#include "io/gguf.h"
#include "model/gguf_convert.h"
#include "model/quant_iface.h"

namespace ptllm {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double uniform01(uint64_t& s) { return double((splitmix64(s) >> 11) + 1) * 0x1.0p-53; }  // (0, 1]

uint64_t name_hash(const std::string& s) {  // FNV-1a: a stable per-tensor stream
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Row `row` of tensor `name`: N(0, std) by Box-Muller from its own stream, so
// rows can be generated in any order (and in parallel) with the same result.
void random_row(uint64_t seed, uint64_t tensor, int64_t row, float std, float* out, int64_t n) {
  uint64_t s = seed ^ tensor ^ (uint64_t(row) * 0xd1b54a32d192ed03ull);
  for (int64_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform01(s))), a = 2 * std::numbers::pi * uniform01(s);
    out[i] = float(r * std::cos(a)) * std;
    if (i + 1 < n) out[i + 1] = float(r * std::sin(a)) * std;
  }
}

}  // namespace

ModelConfig random_model_preset(const std::string& preset) {
  ModelConfig c;
  c.family = Family::Llama;
  c.model_type = "llama";
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.vocab_size = 128256;
  c.max_position = 131072;
  c.rms_eps = 1e-5;
  c.rope.theta = 500000.0;
  c.bos_id = 1;
  c.eos_ids = {2};
  if (preset == "llama-3.2-1b") {
    c.hidden_size = 2048, c.n_layers = 16, c.intermediate_size = 8192, c.tie_embeddings = true;
  } else if (preset == "llama-3.1-8b") {
    c.hidden_size = 4096, c.n_layers = 32, c.intermediate_size = 14336, c.tie_embeddings = false;
  } else {
    fail("--preset {}: expected llama-3.2-1b or llama-3.1-8b", preset);
  }
  c.head_dim = c.hidden_size / c.n_heads;
  return c;
}

void write_random_gguf(const std::string& path, const RandomModelOptions& opt) {
  const ModelConfig& c = opt.config;
  if (c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.intermediate_size <= 0 || c.n_heads % c.n_kv_heads)
    fail("make-random: inconsistent shape ({})", c.summary());
  if (is_block_quantised(opt.type) && !have_block_quant())
    fail("--type {}: needs the block-quantisation kernels (ops::quantize_row), not in this build yet",
         dtype_name(opt.type));
  GgufWriter w;
  write_gguf_model_metadata(w, c, opt.name, opt.type);
  write_gguf_byte_tokenizer(w, c.vocab_size);
  const int64_t H = c.hidden_size, F = c.intermediate_size, QD = c.n_heads * c.head_dim,
                KD = c.n_kv_heads * c.head_dim;
  auto weight = [&](const std::string& name, int64_t rows, int64_t cols) {
    const DType t = matrix_storage_type(cols, opt.type);
    w.add_tensor_stream(name, t, {rows, cols}, [=, seed = opt.seed, std = opt.std](const GgufWriter::Emit& emit) {
      constexpr int64_t kPiece = 64;  // rows generated per write
      const size_t row_bytes = storage_bytes(t, size_t(cols));
      std::vector<float> f(size_t(kPiece * cols));
      std::vector<std::byte> out(size_t(kPiece) * row_bytes);
      const uint64_t h = name_hash(name);
      for (int64_t r0 = 0; r0 < rows; r0 += kPiece) {
        const int64_t n = std::min(kPiece, rows - r0);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) {
          float* row = f.data() + i * cols;
          random_row(seed, h, r0 + i, std, row, cols);
          std::byte* o = out.data() + size_t(i) * row_bytes;
          if (t == DType::F32) std::memcpy(o, row, size_t(cols) * 4);
          else if (t == DType::F16 || t == DType::BF16)
            for (int64_t j = 0; j < cols; ++j) {
              const uint16_t b = t == DType::F16 ? f32_to_f16(row[j]) : f32_to_bf16(row[j]);
              std::memcpy(o + 2 * j, &b, 2);
            }
          else ops::quantize_row(t, row, o, cols);
        }
        emit(out.data(), size_t(n) * row_bytes);
      }
    });
  };
  auto ones = std::make_shared<std::vector<float>>(size_t(std::max(H, int64_t(1))), 1.f);
  weight("token_embd.weight", c.vocab_size, H);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    w.add_tensor(p + "attn_norm.weight", DType::F32, {H}, ones->data());
    weight(p + "attn_q.weight", QD, H);
    weight(p + "attn_k.weight", KD, H);
    weight(p + "attn_v.weight", KD, H);
    weight(p + "attn_output.weight", H, QD);
    w.add_tensor(p + "ffn_norm.weight", DType::F32, {H}, ones->data());
    weight(p + "ffn_gate.weight", F, H);
    weight(p + "ffn_up.weight", F, H);
    weight(p + "ffn_down.weight", H, F);
  }
  w.add_tensor("output_norm.weight", DType::F32, {H}, ones->data());
  if (!c.tie_embeddings) weight("output.weight", c.vocab_size, H);
  w.write(path);
}

}  // namespace ptllm
