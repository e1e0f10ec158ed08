#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"

namespace ptllm {
namespace {
using json = nlohmann::json;
// A header larger than this is not a model header; refuse before allocating.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
}  // namespace

// The dtypes safetensors stores, spelled as dtype_name() spells them.
constexpr DType kSafetensorsDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::I8, DType::I32, DType::I64};

DType parse_safetensors_dtype(const std::string& s, const std::string& where) {
  for (DType t : kSafetensorsDtypes)
    if (s == dtype_name(t)) return t;
  fail("{}: unsupported dtype {} (supported: F32, F16, BF16, I8, I32, I64)", where, s);
}

std::string safetensors_dtype_name(DType t) {
  for (DType k : kSafetensorsDtypes)
    if (k == t) return std::string(dtype_name(t));
  fail("safetensors cannot store dtype {}", dtype_name(t));
}

void TensorStore::add_file(const std::string& path, FileLoad how) {
  auto file = std::make_unique<MappedFile>(path, how);
  const size_t size = file->size();
  if (size < 8) fail("{}: truncated safetensors file ({} bytes, expected at least 8)", path, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);  // little-endian u64
  if (header_len > kMaxHeaderBytes || header_len > size - 8)
    fail("{}: truncated safetensors file (header says {} bytes, file has {})", path, header_len, size);
  const char* hp = reinterpret_cast<const char*>(file->data() + 8);
  json header;
  try {
    header = json::parse(hp, hp + header_len);
  } catch (const std::exception& e) {
    fail("{}: safetensors header is not valid JSON", path);
  }
  if (!header.is_object()) fail("{}: safetensors header is not a JSON object", path);
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  const size_t file_index = files_.size();
  // Staged and committed only once the whole header is valid: a throw must
  // not leave views into this (then unmapped) file in the store.
  std::map<std::string, TensorView> staged;
  std::map<std::string, std::string> staged_meta;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) of every tensor, for the overlap check
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) fail("{}: __metadata__ must be an object of strings", path);
      for (auto& [k, v] : info.items()) {
        if (!v.is_string()) fail("{}: __metadata__[{}] must be a string", path, k);
        staged_meta[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") ||
        !info.contains("data_offsets") || !info["dtype"].is_string() || !info["shape"].is_array() ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      fail("{}: malformed entry (expected dtype, shape, data_offsets[2])", where);
    TensorView v;
    v.dtype = parse_safetensors_dtype(info["dtype"].get<std::string>(), where);
    uint64_t numel = 1;
    for (auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) fail("{}: shape entries must be non-negative integers", where);
      uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40)) fail("{}: dimension {} is implausibly large", where, dim);
      numel = checked_mul(numel, dim, where);
      v.shape.push_back(int64_t(dim));
    }
    const auto& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: data_offsets must be non-negative integers", where);
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail("{}: data_offsets [{}, {}) outside the file's {} data bytes (truncated file?)", where, begin, end,
           data_size);
    const uint64_t expect = checked_mul(numel, dtype_size(v.dtype), where);
    if (end - begin != expect)
      fail("{}: {} bytes for shape {} {} (expected {})", where, end - begin, shape_str(v.shape),
           dtype_name(v.dtype), expect);
    v.data = file->data() + data_start + begin;
    if (end > begin) ranges.emplace_back(begin, end);
    if (tensors_.count(name)) fail("{}: duplicate tensor name", where);
    staged[name] = std::move(v);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      fail("{}: tensors overlap (data bytes [{}, {}) and [{}, {}))", path, ranges[i - 1].first, ranges[i - 1].second,
           ranges[i].first, ranges[i].second);
  for (auto& [name, v] : staged) {
    file_of_[name] = file_index;
    tensors_[name] = std::move(v);
  }
  for (auto& [k, v] : staged_meta) metadata_[k] = std::move(v);
  files_.push_back(std::move(file));
}

void TensorStore::rename(const std::string& from, const std::string& to) {
  auto it = tensors_.find(from);
  if (it == tensors_.end()) fail("missing tensor {}", from);
  if (from == to) return;
  if (tensors_.count(to)) fail("duplicate tensor name {}", to);
  tensors_[to] = std::move(it->second);
  tensors_.erase(it);
  if (auto s = view_source_.find(from); s != view_source_.end()) {
    view_source_[to] = s->second;
    view_source_.erase(from);
    return;
  }
  file_of_[to] = file_of_[from];
  file_of_.erase(from);
}

void TensorStore::add_view(const std::string& name, TensorView view, std::shared_ptr<const void> owner,
                           const std::string& source) {
  if (tensors_.count(name)) fail("{}: duplicate tensor name {}", source, name);
  if (owners_.empty() || owners_.back() != owner) owners_.push_back(std::move(owner));
  tensors_[name] = std::move(view);
  view_source_[name] = source;
}

void TensorStore::replace_view(const std::string& name, TensorView view, std::shared_ptr<const void> owner,
                               const std::string& source) {
  if (!tensors_.count(name)) fail("{}: no tensor {} to replace", source, name);
  owners_.push_back(std::move(owner));
  tensors_[name] = std::move(view);
  file_of_.erase(name);
  view_source_[name] = source;
}

TensorStore TensorStore::open_hf_dir(const std::string& dir, FileLoad how) {
  TensorStore store;
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  if (file_exists(index)) {
    json j;
    try {
      j = json::parse(read_text_file(index));
    } catch (const json::exception&) {
      fail("{}: not valid JSON", index);
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: expected a \"weight_map\" object", index);
    std::vector<std::string> shards;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail("{}: weight_map[{}] must be a file name", index, name);
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        fail("{}: shard name {} must be a plain file name", index, f);
      if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
    }
    for (auto& s : shards) store.add_file(dir + "/" + s, how);
    for (auto& [name, file] : j["weight_map"].items())
      if (!store.has(name)) fail("{}: tensor {} listed in the index is missing from {}", index, name, file.get<std::string>());
  } else if (file_exists(single)) {
    store.add_file(single, how);
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  return store;
}

const TensorView& TensorStore::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor {}", name);
  return it->second;
}

std::string TensorStore::source_of(const std::string& name) const {
  if (auto s = view_source_.find(name); s != view_source_.end()) return s->second;
  auto it = file_of_.find(name);
  return it == file_of_.end() ? std::string("?") : files_[it->second]->path();
}

size_t TensorStore::mapped_bytes() const {
  size_t n = 0;
  for (auto& f : files_) n += f->size();
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (auto& t : tensors) {
    uint64_t n = 1;
    for (auto d : t.shape) n *= uint64_t(d);
    const uint64_t bytes = n * dtype_size(t.dtype);
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h.push_back(' ');  // align data to 8 bytes
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open for writing", path);
  uint64_t hl = h.size();
  f.write(reinterpret_cast<const char*>(&hl), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (auto& t : tensors) {
    uint64_t n = 1;
    for (auto d : t.shape) n *= uint64_t(d);
    f.write(static_cast<const char*>(t.data), std::streamsize(n * dtype_size(t.dtype)));
  }
  if (!f) fail("{}: write failed", path);
}

}  // namespace ptllm
