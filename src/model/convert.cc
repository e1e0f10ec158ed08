#include "model/convert.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/mmap.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "model/tensor_names.h"

namespace ptllm {
namespace {
using json = nlohmann::json;

// Tensor data converted (or passed through) for writing; owns converted bytes.
struct OutTensor {
  std::string name;
  TensorView src;
  DType dtype;
  std::vector<std::byte> converted;
};

void convert_data(OutTensor& t) {
  if (t.dtype == t.src.dtype) return;
  const int64_t n = t.src.numel();
  t.converted.resize(storage_bytes(t.dtype, size_t(n)));
  for (int64_t i = 0; i < n; ++i) {
    const float f = t.src.at_f32(i);
    switch (t.dtype) {
      case DType::F32: std::memcpy(t.converted.data() + 4 * i, &f, 4); break;
      case DType::F16: { uint16_t h = f32_to_f16(f); std::memcpy(t.converted.data() + 2 * i, &h, 2); break; }
      case DType::BF16: { uint16_t h = f32_to_bf16(f); std::memcpy(t.converted.data() + 2 * i, &h, 2); break; }
      default: fail("convert: unsupported target dtype {}", dtype_name(t.dtype));
    }
  }
}

void write_all(const std::string& path, std::vector<OutTensor>& ts, const std::map<std::string, std::string>& meta) {
  std::vector<TensorToWrite> w;
  for (auto& t : ts) {
    if (t.src.dtype != DType::F32 && t.src.dtype != DType::F16 && t.src.dtype != DType::BF16)
      fail("convert: tensor {} has dtype {} (supported: F32, F16, BF16)", t.name, dtype_name(t.src.dtype));
    convert_data(t);
    w.push_back({t.name, t.dtype, t.src.shape, t.converted.empty() ? static_cast<const void*>(t.src.data) : t.converted.data()});
  }
  write_safetensors(path, w, meta);
}

}  // namespace

void convert_hf_to_tinygpt(const std::string& hf_dir, const std::string& out_path, std::optional<DType> dtype) {
  auto model = Model::load_hf(hf_dir);  // validates every tensor and the config
  const ModelConfig& c = model->config();
  if (c.family != Family::Llama && c.family != Family::Mistral)
    fail("{}: .tinygpt holds Llama-architecture models; {} is not supported", hf_dir, c.model_type);
  if (c.qkv_bias) fail("{}: attention biases cannot be stored in .tinygpt", hf_dir);
  if (c.sliding_window > 0) fail("{}: a sliding window cannot be stored in .tinygpt", hf_dir);
  if (c.rope.type != RopeConfig::Type::Default)
    fail("{}: RoPE scaling cannot be stored in .tinygpt (supported: default RoPE)", hf_dir);
  if (c.bos_id < 0 || c.eos_ids.empty()) fail("{}: config needs bos_token_id and eos_token_id for .tinygpt", hf_dir);
  json cfg = {{"arch", "tinygpt"},        {"vocab_size", c.vocab_size},   {"d_model", c.hidden_size},
              {"n_layers", c.n_layers},   {"n_heads", c.n_heads},         {"n_kv_heads", c.n_kv_heads},
              {"head_dim", c.head_dim},   {"ffn_dim", c.intermediate_size}, {"context_length", c.max_position},
              {"rope_theta", c.rope.theta}, {"norm_eps", c.rms_eps},      {"tie_embeddings", c.tie_embeddings},
              {"bos_token_id", c.bos_id}, {"eos_token_id", c.eos_ids[0]}};
  std::map<std::string, std::string> meta = {{"format", "tinygpt"}, {"version", "1"}, {"config", cfg.dump()}};
  if (file_exists(hf_dir + "/tokenizer.json")) meta["tokenizer"] = read_text_file(hf_dir + "/tokenizer.json");
  std::vector<OutTensor> ts;
  for (auto& [name, t] : model->tensors().all()) {
    std::string tn = tinygpt_name_of(name);
    if (tn.empty()) continue;  // e.g. rotary caches some exporters add
    if (tn == "output.weight" && c.tie_embeddings) continue;
    ts.push_back({tn, t, dtype.value_or(t.dtype), {}});
  }
  write_all(out_path, ts, meta);
}

void convert_tinygpt_to_hf(const std::string& path, const std::string& out_dir, std::optional<DType> dtype) {
  std::string tok;
  auto model = Model::load_tinygpt(path, &tok);
  const ModelConfig& c = model->config();
  if (c.yoco()) fail("{}: a YOCO model has no Hugging Face Llama equivalent; only plain .tinygpt converts back", path);
  std::filesystem::create_directories(out_dir);
  // The torch dtype transformers should load: the stored one when uniform.
  DType stored = model->tensors().all().begin()->second.dtype;
  const DType out_dt = dtype.value_or(stored);
  json cfg = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", c.vocab_size},
              {"hidden_size", c.hidden_size},
              {"intermediate_size", c.intermediate_size},
              {"num_hidden_layers", c.n_layers},
              {"num_attention_heads", c.n_heads},
              {"num_key_value_heads", c.n_kv_heads},
              {"head_dim", c.head_dim},
              {"max_position_embeddings", c.max_position},
              {"rms_norm_eps", c.rms_eps},
              {"rope_theta", c.rope.theta},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"tie_word_embeddings", c.tie_embeddings},
              {"bos_token_id", c.bos_id},
              {"eos_token_id", c.eos_ids.at(0)},
              {"torch_dtype", out_dt == DType::F32 ? "float32" : out_dt == DType::F16 ? "float16" : "bfloat16"}};
  std::ofstream(out_dir + "/config.json") << cfg.dump(2) << "\n";
  std::ofstream(out_dir + "/generation_config.json")
      << json{{"bos_token_id", c.bos_id}, {"eos_token_id", c.eos_ids.at(0)}}.dump(2) << "\n";
  if (!tok.empty()) std::ofstream(out_dir + "/tokenizer.json") << tok;
  std::vector<OutTensor> ts;
  for (auto& [name, t] : model->tensors().all()) ts.push_back({name, t, dtype.value_or(t.dtype), {}});
  write_all(out_dir + "/model.safetensors", ts, {{"format", "pt"}});
}

}  // namespace ptllm
