#include "model/tensor_names.h"

#include <regex>
#include <string_view>
#include <utility>

namespace ptllm {
namespace {

// (HF, .tinygpt) for the whole-model tensors and, below, per layer.
constexpr std::pair<std::string_view, std::string_view> kModelNames[] = {
    {"model.embed_tokens.weight", "tok_embeddings.weight"},
    {"model.norm.weight", "norm.weight"},
    {"lm_head.weight", "output.weight"}};
constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},         {"self_attn.q_proj.weight", "attn.wq.weight"},
    {"self_attn.k_proj.weight", "attn.wk.weight"},          {"self_attn.v_proj.weight", "attn.wv.weight"},
    {"self_attn.o_proj.weight", "attn.wo.weight"},          {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn.w_gate.weight"},          {"mlp.up_proj.weight", "ffn.w_up.weight"},
    {"mlp.down_proj.weight", "ffn.w_down.weight"}};

// `from` side 0 = HF, 1 = .tinygpt.
std::string translate(const std::string& name, int from) {
  const auto side = [](const auto& p, int s) { return s == 0 ? p.first : p.second; };
  for (const auto& p : kModelNames)
    if (name == side(p, from)) return std::string(side(p, 1 - from));
  static const std::regex hf_layer(R"(model\.layers\.(\d+)\.(.+))"), tg_layer(R"(layers\.(\d+)\.(.+))");
  static const char* const prefix[] = {"model.layers.", "layers."};
  std::smatch m;
  if (std::regex_match(name, m, from == 0 ? hf_layer : tg_layer))
    for (const auto& p : kLayerNames)
      if (m[2].str() == side(p, from)) return prefix[1 - from] + m[1].str() + "." + std::string(side(p, 1 - from));
  if (name.rfind("yoco.", 0) == 0) return name;
  return "";
}

}  // namespace

std::string tinygpt_name_of(const std::string& hf) { return translate(hf, 0); }
std::string hf_name_of(const std::string& tinygpt) { return translate(tinygpt, 1); }

}  // namespace ptllm
