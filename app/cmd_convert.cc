// `convert`: Hugging Face folder <-> .tinygpt single file.
#include <fmt/core.h>

#include "app/commands.h"
#include "core/error.h"
#include "io/mmap.h"
#include "model/convert.h"
#include "model/gguf_convert.h"
#include "tokenizer/gguf_file.h"

namespace ptllm::cli {

void add_convert_command(CLI::App& root) {
  struct Opts {
    std::string src, dst, dtype, type = "f16";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "convert", "Convert a Hugging Face Llama folder to .tinygpt (SRC OUT.tinygpt) or GGUF (SRC OUT.gguf), or back "
                 "(IN.tinygpt|IN.gguf OUT_DIR)");
  cmd->add_option("src", o->src, "Hugging Face folder or .tinygpt file")->required();
  cmd->add_option("dst", o->dst, "Output .tinygpt file or folder")->required();
  cmd->add_option("--dtype", o->dtype, "Store tensors as f32, f16 or bf16 (default: keep each tensor's dtype)");
  cmd->add_option("--type", o->type, "GGUF output: weights as f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k (default f16)");
  cmd->callback([o] {
    std::optional<DType> dt;
    if (o->dtype == "f32") dt = DType::F32;
    else if (o->dtype == "f16") dt = DType::F16;
    else if (o->dtype == "bf16") dt = DType::BF16;
    else if (!o->dtype.empty()) fail("--dtype {}: expected one of f32, f16, bf16", o->dtype);
    if (o->dst.ends_with(".gguf")) {
      GgufConvertOptions opt;
      opt.type = parse_gguf_type(o->type, "--type");
      // tokenizer.json (a folder's, or the one a .tinygpt embeds) through the vocab
      // converter: llama.cpp's key names, token types and scores.
      const std::string tok_cfg = o->src + "/tokenizer_config.json";
      const std::string cfg_text = is_directory(o->src) && file_exists(tok_cfg) ? read_text_file(tok_cfg) : "";
      opt.write_tokenizer = [src = o->src, cfg_text](GgufWriter& w, const std::string& tok) {
        if (tok.empty()) fail("{}: no tokenizer.json to write into the GGUF file (llama.cpp needs tokenizer.ggml.*)", src);
        write_gguf_tokenizer(tok, cfg_text, w);
      };
      convert_to_gguf(o->src, o->dst, opt);
    } else if (o->src.ends_with(".gguf")) {
      convert_gguf_to_hf(o->src, o->dst, dt);
    } else if (is_directory(o->src)) {
      if (!o->dst.ends_with(".tinygpt")) fail("{}: output of a folder conversion must end in .tinygpt", o->dst);
      convert_hf_to_tinygpt(o->src, o->dst, dt);
    } else if (o->src.ends_with(".tinygpt")) {
      convert_tinygpt_to_hf(o->src, o->dst, dt);
    } else {
      fail("{}: expected a Hugging Face model folder, a .tinygpt or a .gguf file", o->src);
    }
    fmt::print(stderr, "wrote {}\n", o->dst);
  });
}

}  // namespace ptllm::cli
