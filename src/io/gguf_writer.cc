// GGUF v3 writer. Values are encoded when set (u32 type id + payload), so
// write() only concatenates; tensor data is written in order, each tensor
// starting at a multiple of the alignment and zero-padded after, like
// llama.cpp's own writer (its reader expects the padding after the last one).
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/checked.h"
#include "core/error.h"
#include "io/gguf.h"

namespace ptllm {
namespace {

template <typename T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64)
  out.append(b, sizeof(T));
}
void put_str(std::string& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}
template <typename T>
std::string scalar(T v) {
  std::string s;
  put(s, v);
  return s;
}
template <typename T>
std::string array(GgufType elem, const std::vector<T>& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(elem));
  put<uint64_t>(s, v.size());
  for (const T& x : v) put(s, x);
  return s;
}

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};

}  // namespace

void GgufWriter::set_raw(const std::string& key, GgufType type, std::string payload) {
  std::string enc;
  put<uint32_t>(enc, uint32_t(type));
  enc += payload;
  for (auto& [k, v] : kv_)
    if (k == key) { v = std::move(enc); return; }
  kv_.emplace_back(key, std::move(enc));
}

void GgufWriter::set_u8(const std::string& k, uint8_t v) { set_raw(k, GgufType::U8, scalar(v)); }
void GgufWriter::set_i8(const std::string& k, int8_t v) { set_raw(k, GgufType::I8, scalar(v)); }
void GgufWriter::set_u16(const std::string& k, uint16_t v) { set_raw(k, GgufType::U16, scalar(v)); }
void GgufWriter::set_i16(const std::string& k, int16_t v) { set_raw(k, GgufType::I16, scalar(v)); }
void GgufWriter::set_u32(const std::string& k, uint32_t v) { set_raw(k, GgufType::U32, scalar(v)); }
void GgufWriter::set_i32(const std::string& k, int32_t v) { set_raw(k, GgufType::I32, scalar(v)); }
void GgufWriter::set_u64(const std::string& k, uint64_t v) { set_raw(k, GgufType::U64, scalar(v)); }
void GgufWriter::set_i64(const std::string& k, int64_t v) { set_raw(k, GgufType::I64, scalar(v)); }
void GgufWriter::set_f32(const std::string& k, float v) { set_raw(k, GgufType::F32, scalar(v)); }
void GgufWriter::set_f64(const std::string& k, double v) { set_raw(k, GgufType::F64, scalar(v)); }
void GgufWriter::set_bool(const std::string& k, bool v) { set_raw(k, GgufType::BOOL, scalar<uint8_t>(v ? 1 : 0)); }
void GgufWriter::set_string(const std::string& k, std::string_view v) {
  std::string s;
  put_str(s, v);
  set_raw(k, GgufType::STRING, std::move(s));
}
void GgufWriter::set_string_array(const std::string& k, const std::vector<std::string>& v) {
  std::string s;
  put<uint32_t>(s, uint32_t(GgufType::STRING));
  put<uint64_t>(s, v.size());
  for (const auto& x : v) put_str(s, x);
  set_raw(k, GgufType::ARRAY, std::move(s));
}
void GgufWriter::set_f32_array(const std::string& k, const std::vector<float>& v) {
  set_raw(k, GgufType::ARRAY, array(GgufType::F32, v));
}
void GgufWriter::set_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  set_raw(k, GgufType::ARRAY, array(GgufType::I32, v));
}
void GgufWriter::set_u32_array(const std::string& k, const std::vector<uint32_t>& v) {
  set_raw(k, GgufType::ARRAY, array(GgufType::U32, v));
}
void GgufWriter::set_i64_array(const std::string& k, const std::vector<int64_t>& v) {
  set_raw(k, GgufType::ARRAY, array(GgufType::I64, v));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    fail("GGUF alignment {} is not a power of two", alignment);
  alignment_ = alignment;
  set_u32("general.alignment", alignment);
}

void GgufWriter::check_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const {
  ggml_type_of(dtype);  // throws for dtypes GGUF cannot hold
  if (shape.empty() || shape.size() > 4) fail("GGUF tensor {}: {} dimensions (expected 1..4)", name, shape.size());
  for (int64_t d : shape)
    if (d <= 0) fail("GGUF tensor {}: shape {} has a non-positive dimension", name, shape_str(shape));
  if (uint64_t(shape.back()) % block_elems(dtype) != 0)
    fail("GGUF tensor {}: row length {} is not a multiple of {}'s block of {}", name, shape.back(), dtype_name(dtype),
         block_elems(dtype));
  for (const auto& t : tensors_)
    if (t.name == name) fail("GGUF tensor {}: added twice", name);
}

void GgufWriter::add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data) {
  check_tensor(name, dtype, shape);
  TensorView v{nullptr, dtype, shape};
  tensors_.push_back({name, dtype, shape, v.nbytes(), data, nullptr});
}

void GgufWriter::add_tensor_stream(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                   std::function<void(const Emit&)> produce) {
  check_tensor(name, dtype, shape);
  TensorView v{nullptr, dtype, shape};
  tensors_.push_back({name, dtype, shape, v.nbytes(), nullptr, std::move(produce)});
}

void GgufWriter::write(const std::string& path) const {
  const uint64_t a = alignment_;
  auto pad_to = [a](uint64_t n) { return (a - n % a) % a; };
  std::string head;
  head.append("GGUF", 4);
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_.size());
  for (const auto& [k, enc] : kv_) {
    put_str(head, k);
    head += enc;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_str(head, t.name);
    put<uint32_t>(head, uint32_t(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(head, uint64_t(*it));
    put<uint32_t>(head, ggml_type_of(t.dtype));
    put<uint64_t>(head, offset);
    offset = checked_add(offset, t.bytes, path);
    offset = checked_add(offset, pad_to(offset), path);
  }
  head.append(size_t(pad_to(head.size())), '\0');

  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) fail("{}: cannot open for writing", path);
  auto out = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f.get()) != n) fail("{}: write failed (disk full?)", path);
  };
  out(head.data(), head.size());
  static const char zeros[256] = {};
  for (const auto& t : tensors_) {
    if (t.data) {
      out(t.data, size_t(t.bytes));
    } else {
      uint64_t written = 0;
      t.produce([&](const void* p, size_t n) {
        written += n;
        if (written > t.bytes) fail("{}: tensor {} produced more than its {} bytes", path, t.name, t.bytes);
        out(p, n);
      });
      if (written != t.bytes) fail("{}: tensor {} produced {} of its {} bytes", path, t.name, written, t.bytes);
    }
    for (uint64_t pad = pad_to(t.bytes); pad > 0;) {
      const size_t n = size_t(std::min<uint64_t>(pad, sizeof zeros));
      out(zeros, n);
      pad -= n;
    }
  }
  if (std::fclose(f.release()) != 0) fail("{}: write failed on close", path);
}

}  // namespace ptllm
