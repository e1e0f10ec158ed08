// Model::with_weight_type: quantise (or re-encode) a model's matrices on load.
#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "model/gguf_convert.h"
#include "model/model.h"
#include "ops/quant.h"

namespace ptllm {

std::unique_ptr<Model> Model::with_weight_type(std::unique_ptr<Model> m, DType type, bool relay) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && !is_block_quantised(type))
    fail("--weights: cannot store weights as {}", dtype_name(type));
  TensorStore& store = m->store_;
  std::vector<std::string> names;
  for (const auto& [name, t] : store.all())
    if (t.shape.size() == 2) names.push_back(name);
  for (const std::string& name : names) {
    const TensorView src = store.get(name);
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
    // 64-byte aligned, as a mapped tensor would be.
    std::shared_ptr<std::byte[]> buf(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t(64))),
                                     [](std::byte* p) { ::operator delete[](p, std::align_val_t(64)); });
    if (src.dtype == t) {
      std::memcpy(buf.get(), src.data, bytes);
    } else if (is_block_quantised(t) && !is_block_quantised(src.dtype)) {
      ops::quantize_tensor(t, src.data, src.dtype, rows, cols, buf.get());  // rows in parallel
    } else {
      encode_rows(src, 0, rows, t, buf.get());
    }
    TensorView v;
    v.data = buf.get();
    v.dtype = t;
    v.shape = src.shape;
    if (relays) {
      ops::pack_rows16(t, buf.get(), rows, cols);
      v.dtype = ops::rows16_type(t);
    }
    store.replace_view(name, std::move(v), std::shared_ptr<const void>(buf, buf.get()),
                       fmt::format("{} (--weights: {})", store.source_of(name), dtype_name(t)));
  }
  return std::make_unique<Model>(std::move(m->config_), std::move(m->store_), std::move(m->source_));
}

}  // namespace ptllm
