// GGUF (llama.cpp's single-file model format), versions 2 and 3, little-endian.
//
// Layout: "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv key/values
// (string key, u32 value type, value), n_tensors tensor infos (string name,
// u32 n_dims, u64 ne[n_dims] innermost first, u32 ggml type, u64 offset into
// the data section), padding to general.alignment (default 32), tensor data.
// Strings are u64 length + bytes (no terminator); arrays are u32 element type
// + u64 count + elements.
//
// GgufFile memory-maps the file and validates every count, length and offset
// against the file size (overflow-checked) before handing out a view; views
// stay valid while the GgufFile lives. Any malformed input is a one-line
// ptllm::Error naming the file.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/mmap.h"

namespace ptllm {

// GGUF metadata value types (the numbers are the on-disk ids).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// ggml tensor type id <-> DType. Accepted: F32=0, F16=1, Q4_0=2, Q4_1=3,
// Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, BF16=30.
std::optional<DType> dtype_from_ggml(uint32_t ggml_type);
uint32_t ggml_type_of(DType t);  // throws Error for dtypes GGUF does not store
// "Q2_K" etc. for ids we know but do not accept, "type 99" otherwise.
std::string ggml_type_name(uint32_t ggml_type);

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
  uint64_t offset = 0;      // from the start of the data section
  TensorView view;          // shape = reversed ne (outermost first), data inside the map
};

// One parsed metadata value. Scalars keep their raw little-endian bits; strings
// and string arrays point into the mapping; numeric arrays are decoded on access.
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t bits = 0;           // numeric/bool scalar payload (zero-extended)
  std::string_view str;        // STRING
  GgufType elem = GgufType::U8;  // ARRAY element type
  uint64_t count = 0;          // ARRAY length
  const std::byte* elems = nullptr;     // ARRAY of numbers/bools: first element
  std::vector<std::string_view> strs;   // ARRAY of strings
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path, FileLoad how = FileLoad::Map);  // throws Error naming path
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  size_t file_size() const { return file_.size(); }
  // A tensor's bytes rewritten in place (MappedFile::rewrite: read-in files
  // only; false for a mapped one).
  bool rewrite(const TensorView& v, const std::function<void(std::byte*)>& fn) {
    return file_.rewrite(v.data, v.nbytes(), fn);
  }

  // Metadata, in file order.
  const std::vector<std::string>& keys() const { return key_order_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  const GgufValue& value(const std::string& key) const;  // throws "FILE: missing metadata key KEY"

  // Typed accessors. Integers convert between widths and signedness when the
  // value fits (u32 keys are sometimes written as i32 or u64); floats accept
  // F32 or F64. A wrong type or an out-of-range value is an Error naming key
  // and file. find_* return nullopt for a missing key (and still throw on a
  // wrong type); get_* throw for a missing key.
  std::optional<uint32_t> find_u32(const std::string& key) const;
  std::optional<int32_t> find_i32(const std::string& key) const;
  std::optional<uint64_t> find_u64(const std::string& key) const;
  std::optional<int64_t> find_i64(const std::string& key) const;
  std::optional<float> find_f32(const std::string& key) const;
  std::optional<double> find_f64(const std::string& key) const;
  std::optional<bool> find_bool(const std::string& key) const;
  std::optional<std::string> find_string(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  int32_t get_i32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  double get_f64(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;

  // Arrays (required: a missing key throws). array_* describe any array.
  uint64_t array_size(const std::string& key) const;
  GgufType array_type(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_f32_array(const std::string& key) const;    // F32 / F64 elements
  std::vector<int32_t> get_i32_array(const std::string& key) const;  // any integer elements that fit
  std::vector<int64_t> get_i64_array(const std::string& key) const;  // any integer elements that fit (u64 > 2^63 throws)

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  const TensorView& tensor(const std::string& name) const;  // throws "FILE: missing tensor NAME"

 private:
  void parse();
  const GgufValue* typed(const std::string& key, bool array) const;
  [[noreturn]] void wrong_type(const std::string& key, const GgufValue& v, std::string_view expected) const;

  MappedFile file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string> key_order_;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Writes GGUF v3. Metadata keeps insertion order (setting a key again replaces
// its value in place); tensors are written in the order added, each at an
// offset that is a multiple of the alignment, zero-padded, as llama.cpp does.
// Shapes are given outermost first (like TensorView) and written reversed.
class GgufWriter {
 public:
  void set_u8(const std::string& key, uint8_t v);
  void set_i8(const std::string& key, int8_t v);
  void set_u16(const std::string& key, uint16_t v);
  void set_i16(const std::string& key, int16_t v);
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_i64(const std::string& key, int64_t v);
  void set_f32(const std::string& key, float v);
  void set_f64(const std::string& key, double v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, std::string_view v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void set_u32_array(const std::string& key, const std::vector<uint32_t>& v);
  void set_i64_array(const std::string& key, const std::vector<int64_t>& v);
  // Sets general.alignment too. Must be a power of two.
  void set_alignment(uint32_t alignment);

  // A tensor whose bytes (storage_bytes(dtype, numel), row-major) stay alive until write().
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data);
  // A tensor produced at write time, in pieces: `produce(emit)` must call
  // emit(ptr, n) with exactly the tensor's byte count in total. Lets a writer
  // stream tensors larger than memory (make-random's 8B model).
  using Emit = std::function<void(const void*, size_t)>;
  void add_tensor_stream(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                         std::function<void(const Emit&)> produce);

  void write(const std::string& path) const;  // throws Error naming path

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t bytes;
    const void* data;
    std::function<void(const Emit&)> produce;
  };
  void set_raw(const std::string& key, GgufType type, std::string payload);
  void check_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;

  uint32_t alignment_ = 32;
  std::vector<std::pair<std::string, std::string>> kv_;  // key -> encoded (u32 type + value)
  std::vector<Tensor> tensors_;
};

}  // namespace ptllm
