#include "model/config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/mmap.h"

namespace ptllm {
namespace {
using json = nlohmann::json;

int64_t req_int(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer())
    fail("{}: missing or non-integer \"{}\"", where, key);
  int64_t v = j[key].get<int64_t>();
  if (v <= 0 || v > (int64_t(1) << 31)) fail("{}: \"{}\" = {} is out of range", where, key, v);
  return v;
}

void read_ids(const json& j, const char* key, std::vector<int32_t>& out) {
  if (!j.contains(key)) return;
  const json& v = j[key];
  if (v.is_number_integer()) {
    out = {v.get<int32_t>()};
  } else if (v.is_array()) {
    out.clear();
    for (auto& e : v)
      if (e.is_number_integer()) out.push_back(e.get<int32_t>());
  }
}

void parse_rope(const json& j, const std::string& where, RopeConfig& rope) {
  // transformers 5 writes everything under rope_parameters; transformers 4 uses
  // top-level rope_theta plus an optional rope_scaling object.
  const json* params = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) params = &j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) params = &j["rope_scaling"];
  if (j.contains("rope_theta") && j["rope_theta"].is_number()) rope.theta = j["rope_theta"].get<double>();
  if (!params) return;
  const json& p = *params;
  if (p.contains("rope_theta") && p["rope_theta"].is_number()) rope.theta = p["rope_theta"].get<double>();
  std::string type = "default";
  if (p.contains("rope_type") && p["rope_type"].is_string()) type = p["rope_type"].get<std::string>();
  else if (p.contains("type") && p["type"].is_string()) type = p["type"].get<std::string>();
  auto num = [&](const char* k, double dflt) {
    return p.contains(k) && p[k].is_number() ? p[k].get<double>() : dflt;
  };
  if (type == "default") {
    rope.type = RopeConfig::Type::Default;
  } else if (type == "linear") {
    rope.type = RopeConfig::Type::Linear;
    rope.factor = num("factor", 1.0);
  } else if (type == "llama3") {
    rope.type = RopeConfig::Type::Llama3;
    rope.factor = num("factor", 8.0);
    rope.low_freq_factor = num("low_freq_factor", 1.0);
    rope.high_freq_factor = num("high_freq_factor", 4.0);
    rope.original_max_position = int64_t(num("original_max_position_embeddings", 8192));
  } else {
    fail("{}: unsupported rope type \"{}\" (supported: default, linear, llama3)", where, type);
  }
  if (!(rope.theta > 0) || !(rope.factor > 0))
    fail("{}: rope_theta and factor must be positive", where);
}
}  // namespace

namespace {
ModelConfig parse_hf_config_json(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    fail("{}: not valid JSON", where);
  }
  if (!j.is_object()) fail("{}: expected a JSON object", where);
  ModelConfig c;
  c.model_type = j.value("model_type", std::string());
  if (c.model_type == "llama") c.family = Family::Llama;
  else if (c.model_type == "mistral") c.family = Family::Mistral;
  else if (c.model_type == "qwen2") c.family = Family::Qwen2;
  else
    fail("{}: unsupported architecture model_type \"{}\" (supported: llama, mistral, qwen2)", where,
         c.model_type);
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    // Only a string is echoed: dumping a crafted, deeply nested value recursed
    // once per level and overflowed the stack (fuzz_hf_config).
    fail("{}: unsupported hidden_act {} (supported: silu)", where,
         j["hidden_act"].is_string() ? j["hidden_act"].dump() : std::string("of type ") + j["hidden_act"].type_name());
  c.vocab_size = req_int(j, "vocab_size", where);
  c.hidden_size = req_int(j, "hidden_size", where);
  c.intermediate_size = req_int(j, "intermediate_size", where);
  c.n_layers = req_int(j, "num_hidden_layers", where);
  c.n_heads = req_int(j, "num_attention_heads", where);
  c.n_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                     ? req_int(j, "num_key_value_heads", where)
                     : c.n_heads;
  if (j.contains("head_dim") && !j["head_dim"].is_null()) c.head_dim = req_int(j, "head_dim", where);
  else {
    if (c.hidden_size % c.n_heads) fail("{}: hidden_size not divisible by num_attention_heads", where);
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (c.head_dim > kMaxHeadDim) fail("{}: head_dim {} exceeds the supported maximum {}", where, c.head_dim, kMaxHeadDim);
  if (c.head_dim % 2) fail("{}: head_dim {} must be even for RoPE", where, c.head_dim);
  if (c.n_heads % c.n_kv_heads)
    fail("{}: num_attention_heads {} not divisible by num_key_value_heads {}", where, c.n_heads, c.n_kv_heads);
  c.max_position = j.contains("max_position_embeddings") ? req_int(j, "max_position_embeddings", where) : 2048;
  if (j.contains("rms_norm_eps") && j["rms_norm_eps"].is_number()) c.rms_eps = j["rms_norm_eps"].get<double>();
  c.tie_embeddings = j.value("tie_word_embeddings", false);
  if (c.family == Family::Qwen2) c.qkv_bias = true;
  else if (j.contains("attention_bias") && j["attention_bias"].is_boolean()) c.qkv_bias = j["attention_bias"].get<bool>();
  if (j.contains("mlp_bias") && j["mlp_bias"] == true) fail("{}: mlp_bias=true is not supported", where);
  // Mistral applies its window always; Qwen2 only when use_sliding_window is set.
  const bool window_on = c.family == Family::Mistral ||
                         (c.family == Family::Qwen2 && j.value("use_sliding_window", false));
  if (window_on && j.contains("sliding_window") && j["sliding_window"].is_number_integer())
    c.sliding_window = j["sliding_window"].get<int64_t>();
  if (c.sliding_window < 0) fail("{}: sliding_window must be positive", where);
  parse_rope(j, where, c.rope);
  std::vector<int32_t> bos;
  read_ids(j, "bos_token_id", bos);
  if (!bos.empty()) c.bos_id = bos[0];
  read_ids(j, "eos_token_id", c.eos_ids);
  return c;
}
}  // namespace

ModelConfig parse_hf_config(const std::string& text, const std::string& where) {
  // json::value()/get() throw json::type_error on a key of the wrong type (e.g.
  // "model_type": 1, found by fuzz_hf_config); report it as an Error naming the file.
  try {
    return parse_hf_config_json(text, where);
  } catch (const json::exception& e) {
    fail("{}: malformed config ({})", where, e.what());
  } catch (const Error& e) {
    // Messages echo strings from the file (model_type, rope type): keep them one line.
    std::string m;
    for (char ch : std::string_view(e.what())) m += ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : std::string(1, ch);
    throw Error(m);
  }
}

ModelConfig load_hf_config(const std::string& dir) {
  if (!is_directory(dir) && !file_exists(dir)) fail("{}: no such file or folder", dir);
  const std::string path = dir + "/config.json";
  if (!file_exists(path)) fail("{}: model folder has no config.json", dir);
  ModelConfig c = parse_hf_config(read_text_file(path), path);
  const std::string gen = dir + "/generation_config.json";
  if (file_exists(gen)) {
    try {
      json g = json::parse(read_text_file(gen));
      std::vector<int32_t> bos;
      read_ids(g, "bos_token_id", bos);
      if (!bos.empty()) c.bos_id = bos[0];
      read_ids(g, "eos_token_id", c.eos_ids);
    } catch (const json::exception&) {
      fail("{}: not valid JSON", gen);
    }
  }
  return c;
}

std::string ModelConfig::summary() const {
  return fmt::format("{} · {} layers · d_model {} · {} heads / {} kv heads × head_dim {} · ffn {} · vocab {} · ctx {}",
                     model_type, n_layers, hidden_size, n_heads, n_kv_heads, head_dim, intermediate_size,
                     vocab_size, max_position);
}

}  // namespace ptllm
