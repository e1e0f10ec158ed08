// Helpers shared by CLI commands.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ptllm {
class Model;
struct LoadedModel;
}

namespace ptllm::cli {

// Parses "1,2,3" into ids; throws Error naming `flag` on bad input.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& flag);
// Adds --threads to a command; apply_threads() sets the kernel thread count.
void add_threads_flag(CLI::App* cmd, int& threads);
void apply_threads(int threads);

// --weights TYPE: the model's matrices quantised (re-encoded) on load, as
// `convert --type TYPE` would store them; "" = as stored. --mmap: map the
// model's files instead of reading them into memory (LoadOptions::file_load).
// load_model_opts() is how every command that takes them loads its model.
struct WeightOpts {
  std::string type;
  bool mmap = false;
  bool keep_layout = false;
};
void add_weights_flag(CLI::App* cmd, WeightOpts& weights);
LoadedModel load_model_opts(const std::string& path, const WeightOpts& weights);

// --device cpu|cuda, --device-weights auto|f32|bf16|f16 and --device-batch-invariant
// (src/cuda/backend.h).
struct DeviceOpts {
  std::string device = "cpu", weights = "auto";
  bool batch_invariant = false;
};
void add_device_flags(CLI::App* cmd, DeviceOpts& o);
// With --device cuda: uploads the model and makes every cache of it a GPU
// cache until the returned guard goes (throws a one-line Error when this build
// or machine has no CUDA). --device cpu: does nothing.
struct DeviceGuard {
  bool active = false;
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  DeviceGuard(DeviceGuard&& o) noexcept : active(o.active) { o.active = false; }
  ~DeviceGuard();
};
[[nodiscard]] DeviceGuard apply_device(const Model& model, const DeviceOpts& o);

}  // namespace ptllm::cli
