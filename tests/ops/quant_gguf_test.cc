// llama.cpp as the independent reference for the block layouts: the GGUF files
// in ../shared/models/flagship-27m-gguf were written by llama.cpp's
// llama-quantize from the bf16 flagship model. Every block-typed tensor must
// dequantise to that model's weights within its type's quantisation error (a
// wrong nibble order or scale packing gives an error near 1.4), and our
// round-to-nearest quantisers must reproduce llama.cpp's Q8_0 / Q4_0 bytes
// exactly from the same f16 input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "test_util.h"

namespace ptllm {
namespace {

// GGUF name -> Hugging Face name, for tensors llama.cpp stores unpermuted.
std::string hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output.weight") return "lm_head.weight";
  static const std::pair<const char*, const char*> kMap[] = {{"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"},
                                                             {"ffn_down", "mlp.down_proj"}, {"attn_v", "self_attn.v_proj"},
                                                             {"attn_output", "self_attn.o_proj"}};
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  for (auto [from, to] : kMap)
    if (rest == std::string(from) + ".weight") return "model.layers." + layer + "." + to + ".weight";
  return "";  // attn_q / attn_k: rows permuted for interleaved RoPE; norms: not block-typed
}

void check_file(const std::string& file, const TensorStore& hf, std::map<DType, int>& seen, double& worst_ratio) {
  // The file through the engine's reader (io/gguf.h, tested on its own in
  // tests/io): what is checked here is the block layouts, not the parsing.
  const GgufFile g(test::shared_dir() + "/models/flagship-27m-gguf/" + file);
  // Relative RMS error vs the bf16 weights the file was made from.
  const std::map<DType, double> bound = {{DType::Q8_0, 0.01}, {DType::Q4_0, 0.15}, {DType::Q4_1, 0.15},
                                         {DType::Q5_0, 0.08}, {DType::Q5_1, 0.08}, {DType::Q4_K, 0.12},
                                         {DType::Q5_K, 0.06}, {DType::Q6_K, 0.04}};
  for (const GgufTensorInfo& info : g.tensors()) {
    const std::string& name = info.name;
    const TensorView& t = info.view;
    const std::string hn = hf_name(name);
    if (!is_block_quantised(t.dtype) || hn.empty()) continue;
    SCOPED_TRACE(file + " " + name + " " + std::string(dtype_name(t.dtype)));
    const TensorView& ref = hf.get(hn);
    ASSERT_EQ(ref.rows(), t.rows());
    ASSERT_EQ(ref.cols(), t.cols());
    std::vector<float> w(size_t(t.rows() * t.cols())), y(w.size());
    ops::to_f32(ref.data, ref.dtype, w.data(), t.rows() * t.cols());
    ops::to_f32(t.data, t.dtype, y.data(), t.rows() * t.cols());
    double e2 = 0, x2 = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      e2 += double(y[i] - w[i]) * (y[i] - w[i]);
      x2 += double(w[i]) * w[i];
    }
    const double rel = std::sqrt(e2 / x2);
    EXPECT_LT(rel, bound.at(t.dtype));
    if (seen[t.dtype]++ == 0) std::printf("%s %s: relative RMS error %.4f\n", file.c_str(), name.c_str(), rel);
    // llama-quantize read the weights as f16 (bf16 -> f16 by its converter).
    for (auto& v : w) v = f16_to_f32(f32_to_f16(v));
    std::vector<std::byte> mine(ops::quantized_bytes(t.dtype, t.rows(), t.cols()));
    ops::quantize_tensor(t.dtype, w.data(), DType::F32, t.rows(), t.cols(), mine.data());
    if (t.dtype != DType::Q8_0 && t.dtype != DType::Q4_0) {
      // K types: our scale search (not ggml's algorithm) must come within 5%
      // of the error of llama.cpp's own (imatrix-free) quantisation.
      ops::to_f32(mine.data(), t.dtype, y.data(), t.rows() * t.cols());
      double m2 = 0;
      for (size_t i = 0; i < w.size(); ++i) m2 += double(y[i] - w[i]) * (y[i] - w[i]);
      EXPECT_LT(std::sqrt(m2 / x2), 1.05 * rel) << "ours vs llama.cpp's error";
      worst_ratio = std::max(worst_ratio, std::sqrt(m2 / x2) / rel);
      continue;
    }
    size_t diff = 0;
    for (size_t i = 0; i < mine.size(); ++i) diff += mine[i] != t.data[i];
    EXPECT_EQ(diff, 0u) << "bytes differing from llama.cpp's, of " << mine.size();
  }
}

TEST(QuantGguf, LlamaCppBlocksDecodeToTheBf16WeightsAndMatchOurQuantisers) {
  const TensorStore hf = TensorStore::open_hf_dir(test::shared_dir() + "/models/flagship-27m");
  std::map<DType, int> seen;
  double worst_ratio = 0;
  for (const char* f : {"flagship-q8_0.gguf", "flagship-q4_0.gguf", "flagship-q4_k_m.gguf"})
    check_file(f, hf, seen, worst_ratio);
  std::printf("K types: worst (our error / llama.cpp's error) over all tensors %.3f\n", worst_ratio);
  // The files cover these types; a silent skip would make the test vacuous.
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K}) EXPECT_GT(seen[t], 0) << dtype_name(t);
}

}  // namespace
}  // namespace ptllm
