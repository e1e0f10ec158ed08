// The one table of .tinygpt tensor names and their Hugging Face names
// (specs/tinygpt-format.md): convert writes with it, the .tinygpt loader
// reads with it.
#pragma once
#include <string>

namespace ptllm {

// "model.layers.3.self_attn.q_proj.weight" -> "layers.3.attn.wq.weight"; "" when
// the tensor is not part of the format. yoco.* names are the same in both.
std::string tinygpt_name_of(const std::string& hf);
// The inverse; "" for a name the format does not define.
std::string hf_name_of(const std::string& tinygpt);

}  // namespace ptllm
