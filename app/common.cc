#include "app/common.h"

#include <charconv>

#include "core/error.h"
#include "cuda/backend.h"
#include "engine/session.h"
#include "model/gguf_convert.h"
#include "ops/ops.h"

namespace ptllm::cli {

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ',' || s[i] == ' ' || s[i] == '[' || s[i] == ']')) ++i;
    if (i >= s.size()) break;
    int32_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
    if (ec != std::errc() || v < 0) fail("{} \"{}\": expected comma-separated non-negative token ids", flag, s);
    ids.push_back(v);
    i = size_t(p - s.data());
  }
  if (ids.empty()) fail("{}: expected at least one token id", flag);
  return ids;
}

void add_threads_flag(CLI::App* cmd, int& threads) {
  cmd->add_option("--threads", threads, "Worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
}

void apply_threads(int threads) { ops::set_num_threads(threads); }

void add_weights_flag(CLI::App* cmd, WeightOpts& weights) {
  cmd->add_flag("--mmap", weights.mmap,
                "Map the model's files (pages shared with other processes through the page cache) instead of "
                "reading them into memory with huge pages (the default: faster decode, docs/BENCHMARKS.md)");
  cmd->add_option("--weights", weights.type,
                  "Quantise the weight matrices on load: q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (or f16, "
                  "bf16, f32); as `convert --type` stores them (default: as in the file)");
  cmd->add_flag("--keep-layout", weights.keep_layout,
                "Keep Q8_0, Q4_0 and Q4_K weights in the file's row layout (by default they are re-laid in 16-row groups "
                "for the AVX-512 kernels, about 2x their speed)");
}

LoadedModel load_model_opts(const std::string& path, const WeightOpts& weights) {
  LoadOptions opt;
  // Parsed before the (slow) load so a bad value fails at once.
  if (!weights.type.empty()) opt.weights = parse_gguf_type(weights.type, "--weights");
  opt.file_load = weights.mmap ? FileLoad::Map : FileLoad::Read;
  opt.relay_weights = !weights.keep_layout;
  return load_model(path, opt);
}

void add_device_flags(CLI::App* cmd, DeviceOpts& o) {
  cmd->add_option("--device", o.device, "Where the model runs: cpu (default) or cuda");
  cmd->add_option("--device-weights", o.weights,
                  "--device cuda: weights on the GPU as auto (as stored), f32, bf16 or f16 (default auto)");
  cmd->add_flag("--device-batch-invariant", o.batch_invariant,
                "--device cuda: each sequence's logits bit for bit the same alone or in a batch of any size, as on "
                "the CPU (slower at 1 and at 16+ sequences a step; docs/CUDA.md). The CPU engine always is");
}

DeviceGuard::~DeviceGuard() {
  if (active) cuda::deactivate();
}

DeviceGuard apply_device(const Model& model, const DeviceOpts& o) {
  DeviceGuard g;
  const cuda::WeightType w = cuda::parse_weight_type(o.weights, "--device-weights");
  if (o.device == "cpu") return g;
  if (o.device != "cuda") fail("--device {}: expected cpu or cuda", o.device);
  cuda::EngineOptions eo;
  eo.batch_invariant = o.batch_invariant;
  cuda::activate(model, w, eo);
  g.active = true;
  return g;
}

}  // namespace ptllm::cli
