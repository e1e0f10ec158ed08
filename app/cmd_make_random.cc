// `make-random`: a random-weight Llama GGUF at a real model's shape (for
// benchmarks and loader tests without downloading weights).
#include <fmt/core.h>

#include "app/commands.h"
#include "core/error.h"
#include "model/gguf_convert.h"
#include "model/random_model.h"

namespace ptllm::cli {

void add_make_random_command(CLI::App& root) {
  struct Opts {
    std::string out, preset, type = "f16";
    int64_t vocab = 0, layers = 0;
    uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("make-random", "Write a random-weight Llama GGUF (weights N(0, 0.02), norms 1)");
  cmd->add_option("out", o->out, "Output .gguf file")->required();
  cmd->add_option("--preset", o->preset, "llama-3.2-1b or llama-3.1-8b")->required();
  cmd->add_option("--type", o->type, "Weights as f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k (default f16)");
  cmd->add_option("--vocab", o->vocab, "Vocabulary size (default: the preset's 128256; at least 259)");
  cmd->add_option("--layers", o->layers, "Number of layers (default: the preset's)");
  cmd->add_option("--seed", o->seed, "RNG seed (default 1; the same seed writes the same file)");
  cmd->callback([o] {
    if (!o->out.ends_with(".gguf")) fail("{}: output must end in .gguf", o->out);
    RandomModelOptions opt;
    opt.config = random_model_preset(o->preset);
    opt.type = parse_gguf_type(o->type, "--type");
    opt.seed = o->seed;
    opt.name = "random-" + o->preset;
    if (o->vocab != 0) {
      if (o->vocab < 259 || o->vocab > (int64_t(1) << 24)) fail("--vocab {}: expected 259 .. 16777216", o->vocab);
      opt.config.vocab_size = o->vocab;
    }
    if (o->layers != 0) {
      if (o->layers < 1 || o->layers > 1024) fail("--layers {}: expected 1 .. 1024", o->layers);
      opt.config.n_layers = o->layers;
    }
    write_random_gguf(o->out, opt);
    fmt::print(stderr, "wrote {} ({})\n", o->out, opt.config.summary());
  });
}

}  // namespace ptllm::cli
