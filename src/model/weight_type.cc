// Model::with_weight_type: quantise (or re-encode) a model's matrices on load.
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "model/gguf_convert.h"
#include "model/model.h"
#include "ops/quant.h"

namespace ptllm {

std::unique_ptr<Model> Model::with_weight_type(std::unique_ptr<Model> m, DType type, bool relay) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && !is_block_quantised(type))
    fail("--weights: cannot store weights as {}", dtype_name(type));
  TensorStore& store = m->store_;
  // The matrices to re-encode and where each goes in one arena.
  struct Job {
    std::string name;
    DType t;
    bool relays;
    size_t at, bytes;
  };
  std::vector<Job> jobs;
  size_t total = 0;
  for (const auto& [name, src] : store.all()) {
    if (src.shape.size() != 2) continue;
    const int64_t rows = src.shape[0], cols = src.shape[1];
    const DType t = matrix_storage_type(cols, type);
    const bool relays = relay && rows % 16 == 0 && ops::rows16_pays(t);
    // Already of the type: kept as it is, or copied to be re-laid (the file is mapped, see load_model).
    if (src.dtype == t && !relays) continue;
    if (row_group(src.dtype) != 1 ||
        (src.dtype != DType::F32 && src.dtype != DType::F16 && src.dtype != DType::BF16 && !is_block_quantised(src.dtype)))
      fail("{}: tensor {} has dtype {}, which --weights cannot re-encode", store.source_of(name), name,
           dtype_name(src.dtype));
    const size_t bytes = size_t(rows) * storage_bytes(t, size_t(cols));
    jobs.push_back({name, t, relays, total, bytes});
    total += (bytes + 63) / 64 * 64;  // 64-byte aligned, as a mapped tensor would be
  }
  if (jobs.empty()) return m;
  // One allocation in huge pages, as a file read in is (core/memory.h):
  // decode reads these bytes every token. Each tensor shares its ownership.
  const std::shared_ptr<std::byte[]> arena = huge_buffer(total, "--weights");
  for (const Job& j : jobs) {
    const TensorView src = store.get(j.name);
    const int64_t rows = src.shape[0], cols = src.shape[1];
    std::byte* buf = arena.get() + j.at;
    if (src.dtype == j.t) {
      std::memcpy(buf, src.data, j.bytes);
    } else if (is_block_quantised(j.t) && !is_block_quantised(src.dtype)) {
      ops::quantize_tensor(j.t, src.data, src.dtype, rows, cols, buf);  // rows in parallel
    } else {
      encode_rows(src, 0, rows, j.t, buf);
    }
    TensorView v;
    v.data = buf;
    v.dtype = j.t;
    v.shape = src.shape;
    if (j.relays) {
      ops::pack_rows16(j.t, buf, rows, cols);
      v.dtype = ops::rows16_type(j.t);
    }
    store.replace_view(j.name, std::move(v), std::shared_ptr<const void>(arena, buf),
                       fmt::format("{} (--weights: {})", store.source_of(j.name), dtype_name(j.t)));
  }
  return std::make_unique<Model>(std::move(m->config_), std::move(m->store_), std::move(m->source_));
}

}  // namespace ptllm
