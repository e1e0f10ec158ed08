#include "model/convert.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/mmap.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/gguf_convert.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/tensor_names.h"

namespace ptllm {
namespace {
using json = nlohmann::json;

// A tensor to write as `dtype`, converted from `src` (any dtype, block-quantised too).
struct OutTensor {
  std::string name;
  TensorView src;
  DType dtype;
};

// Converted tensors are held until the safetensors file is written.
void write_all(const std::string& path, const std::vector<OutTensor>& ts, const std::map<std::string, std::string>& meta) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<TensorToWrite> w;
  for (const OutTensor& t : ts) {
    TensorView s = t.src;
    if (s.shape.size() == 1) s.shape = {1, s.shape[0]};
    bufs.emplace_back(storage_bytes(t.dtype, size_t(s.numel())));
    encode_rows(s, 0, s.shape[0], t.dtype, bufs.back().data());
    w.push_back({t.name, t.dtype, t.src.shape, bufs.back().data()});
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
    ts.push_back({tn, t, dtype.value_or(t.dtype)});
  }
  write_all(out_path, ts, meta);
}

void write_hf_folder(const Model& model, const std::string& out_dir, std::optional<DType> dtype,
                     const std::string& tokenizer_json) {
  const ModelConfig& c = model.config();
  if (dtype && *dtype != DType::F32 && *dtype != DType::F16 && *dtype != DType::BF16)
    fail("--dtype {}: a Hugging Face folder holds f32, f16 or bf16", dtype_name(*dtype));
  std::filesystem::create_directories(out_dir);
  // The torch dtype transformers should load: the embedding's (f32 for block-quantised GGUF weights).
  const DType emb = model.tensors().get("model.embed_tokens.weight").dtype;
  const DType out_dt = dtype.value_or(is_block_quantised(emb) ? DType::F32 : emb);
  const char* types[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};
  const char* model_types[] = {"llama", "mistral", "qwen2"};
  const int fam = c.family == Family::Mistral ? 1 : c.family == Family::Qwen2 ? 2 : 0;
  json cfg = {{"architectures", {types[fam]}},
              {"model_type", model_types[fam]},
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
              {"attention_bias", c.qkv_bias},
              {"mlp_bias", false},
              {"tie_word_embeddings", c.tie_embeddings},
              {"torch_dtype", out_dt == DType::F32 ? "float32" : out_dt == DType::F16 ? "float16" : "bfloat16"}};
  if (c.rope.type == RopeConfig::Type::Linear) cfg["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.factor}};
  if (c.sliding_window > 0) cfg["sliding_window"] = c.sliding_window;
  if (c.family == Family::Qwen2) cfg["use_sliding_window"] = false;
  json gen = json::object();
  if (c.bos_id >= 0) cfg["bos_token_id"] = gen["bos_token_id"] = c.bos_id;
  if (!c.eos_ids.empty()) cfg["eos_token_id"] = gen["eos_token_id"] = c.eos_ids[0];
  std::ofstream(out_dir + "/config.json") << cfg.dump(2) << "\n";
  std::ofstream(out_dir + "/generation_config.json") << gen.dump(2) << "\n";
  if (!tokenizer_json.empty()) std::ofstream(out_dir + "/tokenizer.json") << tokenizer_json;
  // Block-quantised (GGUF) tensors are decoded to the folder's dtype; the others keep theirs unless --dtype.
  std::vector<OutTensor> ts;
  for (const auto& [name, t] : model.tensors().all())
    ts.push_back({name, t, dtype.value_or(is_block_quantised(t.dtype) ? out_dt : t.dtype)});
  write_all(out_dir + "/model.safetensors", ts, {{"format", "pt"}});
}

void convert_tinygpt_to_hf(const std::string& path, const std::string& out_dir, std::optional<DType> dtype) {
  std::string tok;
  auto model = Model::load_tinygpt(path, &tok);
  if (model->config().yoco())
    fail("{}: a YOCO model has no Hugging Face Llama equivalent; only plain .tinygpt converts back", path);
  write_hf_folder(*model, out_dir, dtype, tok);
}

void convert_gguf_to_hf(const std::string& in, const std::string& out_dir, std::optional<DType> dtype) {
  auto model = load_gguf_model(in);
  if (!model->config().rope.freq_factors.empty())
    fail("{}: rope_freqs (Llama 3 RoPE scaling as factors) cannot be written as config.json", in);
  write_hf_folder(*model, out_dir, dtype);
}

}  // namespace ptllm
