#include "model/gguf_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/quant.h"

namespace ptllm {
namespace {

// Per-layer names: GGUF suffix <-> HF suffix (after "blk.N." / "model.layers.N.").
struct LayerName {
  const char* gguf;
  const char* hf;
};
constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
constexpr LayerName kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "PREFIX<N>.rest" -> (N, rest); false when s does not have that form.
bool split_layer(const std::string& s, std::string_view prefix, int64_t& layer, std::string& rest) {
  if (!s.starts_with(prefix)) return false;
  size_t i = prefix.size(), j = i;
  while (j < s.size() && j - i < 9 && s[j] >= '0' && s[j] <= '9') ++j;
  if (j == i || j >= s.size() || s[j] != '.') return false;
  layer = std::stoll(s.substr(i, j - i));
  rest = s.substr(j + 1);
  return true;
}

int64_t positive(const GgufFile& f, const std::string& key, uint32_t v) {
  if (v == 0 || v > (1u << 31)) fail("{}: metadata {} = {} is out of range", f.path(), key, v);
  return int64_t(v);
}

void parse_rope(const GgufFile& f, const std::string& a, ModelConfig& c) {
  c.rope.theta = f.find_f64(a + ".rope.freq_base").value_or(10000.0);
  if (!(c.rope.theta > 0)) fail("{}: metadata {}.rope.freq_base must be positive", f.path(), a);
  if (auto dims = f.find_u32(a + ".rope.dimension_count"); dims && int64_t(*dims) != c.head_dim)
    fail("{}: metadata {}.rope.dimension_count {} != head_dim {} (partial rotary is not supported)", f.path(), a,
         *dims, c.head_dim);
  const std::string type = f.find_string(a + ".rope.scaling.type").value_or("none");
  if (type == "linear") {
    c.rope.type = RopeConfig::Type::Linear;
    c.rope.factor = f.get_f64(a + ".rope.scaling.factor");
    if (!(c.rope.factor > 0)) fail("{}: metadata {}.rope.scaling.factor must be positive", f.path(), a);
  } else if (type != "none") {
    fail("{}: metadata {}.rope.scaling.type \"{}\" is not supported (supported: none, linear; Llama 3 scaling "
         "comes as the rope_freqs tensor)", f.path(), a, type);
  }
  // Llama 3 scaling: llama.cpp stores the per-frequency divisors as a tensor.
  if (const GgufTensorInfo* t = f.find_tensor("rope_freqs.weight")) {
    if (t->view.dtype != DType::F32 || t->view.shape != std::vector<int64_t>{c.head_dim / 2})
      fail("{}: tensor rope_freqs.weight must be F32 [{}], got {} {}", f.path(), c.head_dim / 2,
           dtype_name(t->view.dtype), shape_str(t->view.shape));
    c.rope.freq_factors.resize(size_t(c.head_dim / 2));
    std::memcpy(c.rope.freq_factors.data(), t->view.data, c.rope.freq_factors.size() * 4);
    for (float x : c.rope.freq_factors)
      if (!(x > 0) || !std::isfinite(x)) fail("{}: tensor rope_freqs.weight holds a non-positive factor", f.path());
  }
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& f) {
  ModelConfig c;
  const std::string a = f.get_string("general.architecture");
  if (a == "llama") c.family = Family::Llama;
  else if (a == "qwen2") c.family = Family::Qwen2;
  else fail("{}: unsupported general.architecture \"{}\" (supported: llama, qwen2)", f.path(), a);
  c.model_type = a;
  auto req = [&](const std::string& k) { return positive(f, a + k, f.get_u32(a + k)); };
  c.hidden_size = req(".embedding_length");
  c.n_layers = req(".block_count");
  c.intermediate_size = req(".feed_forward_length");
  c.n_heads = req(".attention.head_count");
  c.n_kv_heads = f.has(a + ".attention.head_count_kv") ? req(".attention.head_count_kv") : c.n_heads;
  c.max_position = req(".context_length");
  if (f.has(a + ".attention.key_length")) {
    c.head_dim = req(".attention.key_length");
  } else {
    if (c.hidden_size % c.n_heads) fail("{}: {}.embedding_length not divisible by head_count", f.path(), a);
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (auto vl = f.find_u32(a + ".attention.value_length"); vl && int64_t(*vl) != c.head_dim)
    fail("{}: metadata {}.attention.value_length {} != key_length {} (not supported)", f.path(), a, *vl, c.head_dim);
  if (c.head_dim > kMaxHeadDim || c.head_dim % 2)
    fail("{}: head_dim {} must be even and at most {}", f.path(), c.head_dim, kMaxHeadDim);
  if (c.n_heads % c.n_kv_heads)
    fail("{}: head_count {} not divisible by head_count_kv {}", f.path(), c.n_heads, c.n_kv_heads);
  c.rms_eps = f.get_f64(a + ".attention.layer_norm_rms_epsilon");
  if (!(c.rms_eps > 0)) fail("{}: metadata {}.attention.layer_norm_rms_epsilon must be positive", f.path(), a);
  if (auto w = f.find_u32(a + ".attention.sliding_window"); w && *w > 0) {
    c.sliding_window = int64_t(*w);
    if (c.family == Family::Llama) c.family = Family::Mistral;
  }
  parse_rope(f, a, c);
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->view.shape.size() != 2) fail("{}: missing 2-D tensor token_embd.weight", f.path());
  c.vocab_size = emb->view.shape[0];
  if (f.has("tokenizer.ggml.tokens") && int64_t(f.array_size("tokenizer.ggml.tokens")) != c.vocab_size)
    fail("{}: tokenizer.ggml.tokens has {} entries but token_embd.weight has {} rows", f.path(),
         f.array_size("tokenizer.ggml.tokens"), c.vocab_size);
  c.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  if (auto bos = f.find_u32("tokenizer.ggml.bos_token_id")) c.bos_id = int32_t(*bos);
  if (auto eos = f.find_u32("tokenizer.ggml.eos_token_id")) c.eos_ids.push_back(int32_t(*eos));
  if (auto eot = f.find_u32("tokenizer.ggml.eot_token_id"); eot && (c.eos_ids.empty() || c.eos_ids[0] != int32_t(*eot)))
    c.eos_ids.push_back(int32_t(*eot));
  for (int32_t id : c.eos_ids)
    if (id < 0 || id >= c.vocab_size) fail("{}: eos token id {} is outside the vocabulary", f.path(), id);
  if (c.bos_id >= c.vocab_size) fail("{}: bos token id {} is outside the vocabulary", f.path(), c.bos_id);
  return c;
}

std::string hf_name_from_gguf(const std::string& g) {
  for (const auto& n : kGlobalNames)
    if (g == n.gguf) return n.hf;
  int64_t layer;
  std::string rest;
  if (!split_layer(g, "blk.", layer, rest)) return "";
  for (const auto& n : kLayerNames)
    if (rest == n.gguf) return fmt::format("model.layers.{}.{}", layer, n.hf);
  return "";
}

std::string gguf_name_from_hf(const std::string& h) {
  for (const auto& n : kGlobalNames)
    if (h == n.hf) return n.gguf;
  int64_t layer;
  std::string rest;
  if (!split_layer(h, "model.layers.", layer, rest)) return "";
  for (const auto& n : kLayerNames)
    if (rest == n.hf) return fmt::format("blk.{}.{}", layer, n.gguf);
  return "";
}

void permute_qk_rows(const std::byte* in, std::byte* out, int64_t n_heads, int64_t head_dim, size_t row_bytes,
                     bool to_gguf) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t j = 0; j < half; ++j) {
        const int64_t hf_row = h * head_dim + part * half + j;
        const int64_t gguf_row = h * head_dim + 2 * j + part;
        const int64_t src = to_gguf ? hf_row : gguf_row, dst = to_gguf ? gguf_row : hf_row;
        std::memcpy(out + size_t(dst) * row_bytes, in + size_t(src) * row_bytes, row_bytes);
      }
}

std::unique_ptr<Model> load_gguf_model(const std::string& path, std::shared_ptr<const GgufFile>* file_out,
                                       FileLoad how, bool relay) {
  auto file = std::make_shared<GgufFile>(path, how);
  const GgufFile& f = *file;
  const auto relays = [&](const TensorView& v) {
    return relay && v.shape.size() == 2 && v.rows() % 16 == 0 && ops::rows16_pays(v.dtype);
  };
  const auto pack = [](TensorView& v, std::byte* data) {
    ops::pack_rows16(v.dtype, data, v.rows(), v.cols());
    v.dtype = ops::rows16_type(v.dtype);
  };
  ModelConfig c = gguf_model_config(f);
  TensorStore store;
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string hf = hf_name_from_gguf(t.name);
    if (hf.empty()) continue;  // rope_freqs (read into the config) and tensors the model does not use
    const bool q = hf.find("q_proj") != std::string::npos, k = hf.find("k_proj") != std::string::npos;
    if (c.model_type != "llama" || (!q && !k)) {
      TensorView v = t.view;
      if (relays(v)) file->rewrite(v, [&](std::byte* p) { pack(v, p); });  // false (v kept) when mapped
      store.add_view(hf, std::move(v), file, path);
      continue;
    }
    // Undo llama.cpp's interleaving permutation into an owned copy.
    const int64_t heads = q ? c.n_heads : c.n_kv_heads;
    if (t.view.rows() != heads * c.head_dim)
      fail("{}: tensor {} has {} rows, expected {} heads x {}", path, t.name, t.view.rows(), heads, c.head_dim);
    auto buf = std::make_shared<std::vector<std::byte>>(t.view.nbytes());
    const size_t row_bytes = t.view.nbytes() / size_t(t.view.rows());
    permute_qk_rows(t.view.data, buf->data(), heads, c.head_dim, row_bytes, /*to_gguf=*/false);
    TensorView v = t.view;
    v.data = buf->data();
    if (relays(v)) pack(v, buf->data());
    store.add_view(hf, std::move(v), buf, path);
  }
  if (file_out) *file_out = file;
  return std::make_unique<Model>(std::move(c), std::move(store), path);
}

}  // namespace ptllm
