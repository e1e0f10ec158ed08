// GGUF -> Hugging Face folder, and the interim tokenizer.json -> tokenizer.ggml.*
// writer (until the vocab branch's converter replaces it).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/gguf_convert.h"
#include "model/gguf_model.h"

namespace ptllm {
namespace {
using json = nlohmann::json;

bool is_byte_token(const std::string& s) {
  return s.size() == 6 && s.starts_with("<0x") && s[5] == '>' && std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4]));
}

}  // namespace

void write_gguf_tokenizer_json(GgufWriter& w, const std::string& text, const std::string& where, const ModelConfig& c) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    fail("{}: not valid JSON", where);
  }
  const json* m = j.is_object() && j.contains("model") ? &j["model"] : nullptr;
  if (!m || !m->is_object() || m->value("type", "") != "BPE" || !m->value("byte_fallback", false) ||
      !m->contains("vocab") || !(*m)["vocab"].is_object())
    fail("{}: only SentencePiece-style BPE with byte_fallback can be written to GGUF here (the vocab branch adds "
         "the others)", where);
  // Token strings in id order; SentencePiece BPE vocabularies are ordered by
  // merge priority, so -id is the score llama.cpp's SPM tokenizer ranks by.
  std::vector<std::string> tokens(size_t(c.vocab_size));
  std::vector<int32_t> types(size_t(c.vocab_size), 1);
  std::vector<float> scores(size_t(c.vocab_size), 0.f);
  std::vector<bool> seen(size_t(c.vocab_size), false);
  for (auto& [tok, id] : (*m)["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= c.vocab_size)
      fail("{}: vocab id of {} is outside 0..{}", where, tok, c.vocab_size - 1);
    const size_t i = size_t(id.get<int64_t>());
    tokens[i] = tok;
    seen[i] = true;
    scores[i] = -float(i);
    if (is_byte_token(tok)) types[i] = 6, scores[i] = 0.f;
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string())
        fail("{}: malformed added_tokens entry", where);
      const int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id >= c.vocab_size) fail("{}: added token id {} is outside the vocabulary", where, id);
      tokens[size_t(id)] = t["content"].get<std::string>();
      seen[size_t(id)] = true;
      types[size_t(id)] = t.value("special", false) ? 3 : 4;
      scores[size_t(id)] = 0.f;
    }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (!seen[i]) tokens[i] = fmt::format("[unused{}]", i);
  std::optional<int64_t> unk;
  if (m->contains("unk_token") && (*m)["unk_token"].is_string())
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == (*m)["unk_token"].get<std::string>()) unk = int64_t(i), types[i] = 2;
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  if (c.bos_id >= 0) w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(c.bos_id));
  if (!c.eos_ids.empty()) w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(c.eos_ids[0]));
  if (unk) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(*unk));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
}

void convert_gguf_to_hf(const std::string& in, const std::string& out_dir, std::optional<DType> dtype) {
  auto model = load_gguf_model(in);
  const ModelConfig& c = model->config();
  if (!c.rope.freq_factors.empty())
    fail("{}: rope_freqs (Llama 3 RoPE scaling as factors) cannot be written as config.json", in);
  if (dtype && *dtype != DType::F32 && *dtype != DType::F16 && *dtype != DType::BF16)
    fail("--dtype {}: a Hugging Face folder holds f32, f16 or bf16", dtype_name(*dtype));
  std::filesystem::create_directories(out_dir);
  const DType emb = model->tensors().get("model.embed_tokens.weight").dtype;
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
  // Converted tensors are held until the safetensors file is written.
  std::vector<std::vector<std::byte>> bufs;
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : model->tensors().all()) {
    const DType dt = dtype.value_or(is_block_quantised(t.dtype) ? out_dt : t.dtype);
    TensorView s = t;
    if (s.shape.size() == 1) s.shape = {1, s.shape[0]};
    bufs.emplace_back(storage_bytes(dt, size_t(t.numel())));
    encode_rows(s, 0, s.shape[0], dt, bufs.back().data());
    out.push_back({name, dt, t.shape, bufs.back().data()});
  }
  write_safetensors(out_dir + "/model.safetensors", out, {{"format", "pt"}});
}

}  // namespace ptllm
