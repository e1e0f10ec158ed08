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

#include "io/mmap.h"
#include "io/safetensors.h"
#include "ops/ops.h"
#include "ops/quant.h"
#include "test_util.h"

namespace ptllm {
namespace {

// Just enough of GGUF v3 to list tensors (the engine's reader lives in io/):
// header, key/values skipped by type, tensor infos, aligned data.
struct GgufTensor {
  DType dtype;
  int64_t rows = 1, cols = 0;
  const std::byte* data = nullptr;
};

class MiniGguf {
 public:
  explicit MiniGguf(const std::string& path) : file_(path) {
    p_ = file_.data();
    end_ = p_ + file_.size();
    if (u32() != 0x46554747u) throw std::runtime_error(path + ": not GGUF");
    if (u32() != 3) throw std::runtime_error(path + ": not GGUF v3");
    const uint64_t n_tensors = u64(), n_kv = u64();
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = str();
      const uint32_t type = u32();
      if (key == "general.alignment" && type == 4) alignment = u32();
      else skip(type);
    }
    std::vector<std::pair<std::string, std::pair<GgufTensor, uint64_t>>> infos;
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensor t;
      const std::string name = str();
      const uint32_t nd = u32();
      std::vector<int64_t> ne(nd);
      for (auto& d : ne) d = int64_t(u64());
      t.cols = ne.at(0);
      for (uint32_t k = 1; k < nd; ++k) t.rows *= ne[k];
      t.dtype = ggml_type(u32());
      infos.push_back({name, {t, u64()}});
    }
    const size_t off = size_t(p_ - file_.data());
    const std::byte* base = file_.data() + (off + alignment - 1) / alignment * alignment;
    for (auto& [name, ti] : infos) {
      ti.first.data = base + ti.second;
      tensors[name] = ti.first;
    }
  }
  std::map<std::string, GgufTensor> tensors;

 private:
  // ggml_type ids (ggml.h): 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K.
  static DType ggml_type(uint32_t t) {
    switch (t) {
      case 0: return DType::F32;
      case 1: return DType::F16;
      case 2: return DType::Q4_0;
      case 3: return DType::Q4_1;
      case 6: return DType::Q5_0;
      case 7: return DType::Q5_1;
      case 8: return DType::Q8_0;
      case 12: return DType::Q4_K;
      case 13: return DType::Q5_K;
      case 14: return DType::Q6_K;
      default: throw std::runtime_error("ggml type " + std::to_string(t));
    }
  }
  void need(size_t n) {
    if (size_t(end_ - p_) < n) throw std::runtime_error("GGUF truncated");
  }
  uint32_t u32() {
    need(4);
    uint32_t v;
    std::memcpy(&v, p_, 4);
    p_ += 4;
    return v;
  }
  uint64_t u64() {
    need(8);
    uint64_t v;
    std::memcpy(&v, p_, 8);
    p_ += 8;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  // Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64.
  void skip(uint32_t type) {
    static const size_t size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8) {
      str();
    } else if (type == 9) {
      const uint32_t et = u32();
      const uint64_t n = u64();
      for (uint64_t i = 0; i < n; ++i) skip(et);
    } else if (type < 13) {
      need(size[type]);
      p_ += size[type];
    } else {
      throw std::runtime_error("GGUF value type " + std::to_string(type));
    }
  }
  MappedFile file_;
  const std::byte* p_;
  const std::byte* end_;
};

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
  MiniGguf g(test::shared_dir() + "/models/flagship-27m-gguf/" + file);
  // Relative RMS error vs the bf16 weights the file was made from.
  const std::map<DType, double> bound = {{DType::Q8_0, 0.01}, {DType::Q4_0, 0.15}, {DType::Q4_1, 0.15},
                                         {DType::Q5_0, 0.08}, {DType::Q5_1, 0.08}, {DType::Q4_K, 0.12},
                                         {DType::Q5_K, 0.06}, {DType::Q6_K, 0.04}};
  for (const auto& [name, t] : g.tensors) {
    const std::string hn = hf_name(name);
    if (!is_block_quantised(t.dtype) || hn.empty()) continue;
    SCOPED_TRACE(file + " " + name + " " + std::string(dtype_name(t.dtype)));
    const TensorView& ref = hf.get(hn);
    ASSERT_EQ(ref.rows(), t.rows);
    ASSERT_EQ(ref.cols(), t.cols);
    std::vector<float> w(size_t(t.rows * t.cols)), y(w.size());
    ops::to_f32(ref.data, ref.dtype, w.data(), t.rows * t.cols);
    ops::to_f32(t.data, t.dtype, y.data(), t.rows * t.cols);
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
    std::vector<std::byte> mine(ops::quantized_bytes(t.dtype, t.rows, t.cols));
    ops::quantize_tensor(t.dtype, w.data(), DType::F32, t.rows, t.cols, mine.data());
    if (t.dtype != DType::Q8_0 && t.dtype != DType::Q4_0) {
      // K types: our scale search (not ggml's algorithm) must come within 5%
      // of the error of llama.cpp's own (imatrix-free) quantisation.
      ops::to_f32(mine.data(), t.dtype, y.data(), t.rows * t.cols);
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
