// .tinygpt reader (../shared/specs/tinygpt-format.md): a safetensors file whose
// __metadata__ carries format/version/config/tokenizer. Tensors are renamed to
// the Hugging Face Llama names so one forward pass serves both formats.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model.h"
#include "model/tensor_names.h"

namespace ptllm {
namespace {
using json = nlohmann::json;

int64_t cfg_int(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) fail("{}: config is missing required key \"{}\"", where, key);
  if (!j[key].is_number_integer()) fail("{}: config \"{}\" must be an integer", where, key);
  const int64_t v = j[key].get<int64_t>();
  if (v <= 0 || v > (int64_t(1) << 31)) fail("{}: config \"{}\" = {} is out of range", where, key, v);
  return v;
}
double cfg_num(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) fail("{}: config is missing required key \"{}\"", where, key);
  if (!j[key].is_number()) fail("{}: config \"{}\" must be a number", where, key);
  return j[key].get<double>();
}

}  // namespace

ModelConfig parse_tinygpt_config(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    fail("{}: metadata \"config\" is not valid JSON", where);
  }
  if (!j.is_object()) fail("{}: metadata \"config\" must be a JSON object", where);
  if (!j.contains("arch") || j["arch"] != "tinygpt")
    fail("{}: config \"arch\" must be \"tinygpt\"", where);
  ModelConfig c;
  c.family = Family::TinyGpt;
  c.model_type = "tinygpt";
  c.vocab_size = cfg_int(j, "vocab_size", where);
  c.hidden_size = cfg_int(j, "d_model", where);
  c.n_layers = cfg_int(j, "n_layers", where);
  c.n_heads = cfg_int(j, "n_heads", where);
  c.n_kv_heads = cfg_int(j, "n_kv_heads", where);
  c.head_dim = cfg_int(j, "head_dim", where);
  c.intermediate_size = cfg_int(j, "ffn_dim", where);
  c.max_position = cfg_int(j, "context_length", where);
  c.rope.theta = cfg_num(j, "rope_theta", where);
  c.rms_eps = cfg_num(j, "norm_eps", where);
  if (!j.contains("tie_embeddings") || !j["tie_embeddings"].is_boolean())
    fail("{}: config is missing required boolean \"tie_embeddings\"", where);
  c.tie_embeddings = j["tie_embeddings"].get<bool>();
  c.bos_id = int32_t(cfg_int(j, "bos_token_id", where));
  c.eos_ids = {int32_t(cfg_int(j, "eos_token_id", where))};
  if (c.head_dim > kMaxHeadDim || c.head_dim % 2) fail("{}: head_dim {} must be even and <= {}", where, c.head_dim, kMaxHeadDim);
  if (c.n_heads % c.n_kv_heads) fail("{}: n_heads {} not divisible by n_kv_heads {}", where, c.n_heads, c.n_kv_heads);
  if (!(c.rope.theta > 0) || !(c.rms_eps > 0)) fail("{}: rope_theta and norm_eps must be positive", where);
  if (j.contains("yoco") && !j["yoco"].is_null()) {
    const json& y = j["yoco"];
    if (!y.is_object()) fail("{}: config \"yoco\" must be an object", where);
    const std::string yw = where + " (yoco)";
    c.yoco_self_layers = cfg_int(y, "self_layers", yw);
    if (c.yoco_self_layers >= c.n_layers) fail("{}: yoco.self_layers {} must be < n_layers {}", where, c.yoco_self_layers, c.n_layers);
    if (y.contains("self_window") && !y["self_window"].is_null()) c.yoco_self_window = cfg_int(y, "self_window", yw);
  }
  return c;
}

std::unique_ptr<Model> Model::load_tinygpt(const std::string& path, std::string* tokenizer_json, FileLoad how) {
  TensorStore store;
  store.add_file(path, how);
  const auto& meta = store.metadata();
  auto get = [&](const char* key) -> const std::string& {
    auto it = meta.find(key);
    if (it == meta.end()) fail("{}: metadata has no \"{}\" (not a .tinygpt file?)", path, key);
    return it->second;
  };
  if (get("format") != "tinygpt") fail("{}: metadata format is \"{}\", expected \"tinygpt\"", path, get("format"));
  if (get("version") != "1") fail("{}: unknown .tinygpt version \"{}\" (supported: 1)", path, get("version"));
  ModelConfig c = parse_tinygpt_config(get("config"), path);
  if (tokenizer_json) {
    auto it = meta.find("tokenizer");
    *tokenizer_json = it == meta.end() ? std::string() : it->second;
  }
  // Rename to the Hugging Face layout the forward pass reads.
  std::vector<std::string> names;
  for (const auto& [name, t] : store.all()) names.push_back(name);
  for (const std::string& name : names)
    if (const std::string hf = hf_name_of(name); !hf.empty() && hf != name) store.rename(name, hf);
  return std::make_unique<Model>(std::move(c), std::move(store), path);
}

}  // namespace ptllm
