// `logits`: full-forward logits for given ids, written as safetensors (the
// hook for golden checks against transformers).
#include <fmt/core.h>

#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "io/safetensors.h"

namespace ptllm::cli {

void add_logits_command(CLI::App& root) {
  struct Opts {
    std::string model, ids, out;
    WeightOpts weights;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("logits", "Write full-forward logits [T, vocab] for token ids");
  cmd->add_option("model", o->model, "Model folder or .tinygpt file")->required();
  cmd->add_option("--ids", o->ids, "Comma-separated token ids")->required();
  cmd->add_option("--out", o->out, "Output .safetensors file (tensor \"logits\", f32)")->required();
  add_threads_flag(cmd, o->threads);
  add_weights_flag(cmd, o->weights);
  cmd->callback([o] {
    apply_threads(o->threads);
    const auto ids = parse_id_list(o->ids, "--ids");
    LoadedModel lm = load_model_opts(o->model, o->weights);
    const auto& c = lm.model->config();
    if (int64_t(ids.size()) > c.max_position)
      fail("--ids: {} tokens is longer than the context of {} tokens", ids.size(), c.max_position);
    for (int32_t id : ids)
      if (id >= c.vocab_size) fail("--ids: token id {} is outside the vocabulary (0..{})", id, c.vocab_size - 1);
    auto cache = make_default_cache(*lm.model, int64_t(ids.size()));
    std::vector<float> logits(ids.size() * size_t(c.vocab_size));
    lm.model->forward(ids.data(), int64_t(ids.size()), *cache, logits.data(), true);
    std::vector<int32_t> ids_copy = ids;
    write_safetensors(o->out, {{"logits", DType::F32, {int64_t(ids.size()), c.vocab_size}, logits.data()},
                               {"input_ids", DType::I32, {int64_t(ids.size())}, ids_copy.data()}});
    fmt::print(stderr, "wrote logits [{}, {}] to {}\n", ids.size(), c.vocab_size, o->out);
  });
}

}  // namespace ptllm::cli
