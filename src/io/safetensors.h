// safetensors reading (single file or sharded with model.safetensors.index.json)
// and writing. Every offset and length in the header is validated against the
// file size before a view is handed out.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mmap.h"

namespace ptllm {

// Tensors by name, backed by one or more memory-mapped files.
class TensorStore {
 public:
  // Adds every tensor of one safetensors file. Throws Error on any malformed header.
  void add_file(const std::string& path, FileLoad how = FileLoad::Map);
  // Loads dir/model.safetensors.index.json (all shards it names) or dir/model.safetensors.
  static TensorStore open_hf_dir(const std::string& dir, FileLoad how = FileLoad::Map);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;  // throws "missing tensor NAME"
  const std::map<std::string, TensorView>& all() const { return tensors_; }
  // Where a tensor came from (for error messages).
  std::string source_of(const std::string& name) const;
  size_t mapped_bytes() const;
  // String metadata ("__metadata__") of every file added, later files winning.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Gives a tensor another name (e.g. .tinygpt names -> Hugging Face names).
  void rename(const std::string& from, const std::string& to);
  // Adds a view into memory that `owner` keeps alive (a GGUF file's mapping, a
  // re-ordered copy of a tensor); `source` names it in error messages.
  void add_view(const std::string& name, TensorView view, std::shared_ptr<const void> owner,
                const std::string& source);
  // Replaces an existing tensor by a view into memory `owner` keeps alive (the
  // re-encoded weights of `--weights`); throws when `name` is absent.
  void replace_view(const std::string& name, TensorView view, std::shared_ptr<const void> owner,
                    const std::string& source);

 private:
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, size_t> file_of_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::shared_ptr<const void>> owners_;  // for add_view
  std::map<std::string, std::string> view_source_;   // add_view's tensors -> source
};

// One tensor to write: raw bytes in dtype, row-major.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

DType parse_safetensors_dtype(const std::string& s, const std::string& where);
std::string safetensors_dtype_name(DType t);

}  // namespace ptllm
