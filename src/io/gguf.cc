// GGUF reader: every read goes through Cursor, which checks the remaining
// bytes first, so no count, length or offset from the file can move a pointer
// outside the mapping.
#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/checked.h"
#include "core/error.h"

namespace ptllm {
namespace {

constexpr uint32_t kMaxDims = 4;                 // GGML_MAX_DIMS
constexpr uint64_t kMaxAlignment = 1ull << 20;   // a larger alignment is not a real file

// Names and keys come from the file: escape control bytes and cap the length
// so an error message stays one readable line.
std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 96; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += char(c);
  }
  if (s.size() > 96) out += "...";
  return out;
}

size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}
bool is_signed(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// The integer in `bits` (zero-extended raw payload of type t) as a 128-bit value.
__int128 integer_of(GgufType t, uint64_t bits) {
  switch (t) {
    case GgufType::I8: return int8_t(bits);
    case GgufType::I16: return int16_t(bits);
    case GgufType::I32: return int32_t(bits);
    case GgufType::I64: return int64_t(bits);
    default: return __int128(bits);
  }
}
double float_of(GgufType t, uint64_t bits) {
  if (t == GgufType::F32) {
    float f;
    const uint32_t b = uint32_t(bits);
    std::memcpy(&f, &b, 4);
    return f;
  }
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
uint64_t load_bits(const std::byte* p, size_t n) {
  uint64_t b = 0;
  std::memcpy(&b, p, n);  // little-endian host (x86-64)
  return b;
}

class Cursor {
 public:
  Cursor(const std::string& path, const std::byte* data, size_t size) : path_(path), data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const std::byte* take(uint64_t n, std::string_view what) {
    if (n > remaining())
      fail("{}: truncated GGUF file: {} needs {} bytes at offset {}, file has {}", path_, what, n, pos_, size_);
    const std::byte* p = data_ + pos_;
    pos_ += size_t(n);
    return p;
  }
  uint32_t u32(std::string_view what) { return uint32_t(load_bits(take(4, what), 4)); }
  uint64_t u64(std::string_view what) { return load_bits(take(8, what), 8); }
  std::string_view str(std::string_view what) {
    const uint64_t n = u64(what);
    return {reinterpret_cast<const char*>(take(n, what)), size_t(n)};
  }

 private:
  const std::string& path_;
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
};

GgufType read_type(Cursor& c, const std::string& path, const std::string& key, std::string_view what) {
  const uint32_t t = c.u32(what);
  if (t > uint32_t(GgufType::F64))
    fail("{}: metadata {}: unknown value type {} (expected 0..12)", path, printable(key), t);
  return GgufType(t);
}

GgufValue read_value(Cursor& c, const std::string& path, const std::string& key) {
  GgufValue v;
  v.type = read_type(c, path, key, "metadata value type");
  if (v.type == GgufType::STRING) {
    v.str = c.str("metadata string");
  } else if (v.type == GgufType::ARRAY) {
    v.elem = read_type(c, path, key, "array element type");
    v.count = c.u64("array length");
    if (v.elem == GgufType::ARRAY) fail("{}: metadata {}: arrays of arrays are not supported", path, printable(key));
    if (v.elem == GgufType::STRING) {
      // Each string takes at least its 8-byte length: bound the count before reserving.
      if (v.count > c.remaining() / 8)
        fail("{}: metadata {}: array of {} strings does not fit in the file", path, printable(key), v.count);
      v.strs.reserve(size_t(v.count));
      for (uint64_t i = 0; i < v.count; ++i) v.strs.push_back(c.str("array string"));
    } else {
      const uint64_t bytes = checked_mul(v.count, scalar_size(v.elem), path + ": metadata array " + printable(key));
      v.elems = c.take(bytes, "array elements");
    }
  } else {
    const size_t n = scalar_size(v.type);
    v.bits = load_bits(c.take(n, "metadata value"), n);
  }
  if (v.type == GgufType::BOOL && v.bits > 1)
    fail("{}: metadata {}: bool value {} (expected 0 or 1)", path, printable(key), v.bits);
  return v;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  static constexpr std::string_view names[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = uint32_t(t);
  return i < std::size(names) ? names[i] : "?";
}

std::optional<DType> dtype_from_ggml(uint32_t t) {
  switch (t) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 2: return DType::Q4_0;
    case 3: return DType::Q4_1;
    case 6: return DType::Q5_0;
    case 7: return DType::Q5_1;
    case 8: return DType::Q8_0;
    case 12: return DType::Q4_K;
    case 13: return DType::Q5_K;
    case 14: return DType::Q6_K;
    case 30: return DType::BF16;
    default: return std::nullopt;
  }
}

uint32_t ggml_type_of(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q5_0: return 6;
    case DType::Q5_1: return 7;
    case DType::Q8_0: return 8;
    case DType::Q4_K: return 12;
    case DType::Q5_K: return 13;
    case DType::Q6_K: return 14;
    case DType::BF16: return 30;
    default: break;
  }
  fail("GGUF cannot store dtype {}", dtype_name(t));
}

std::string ggml_type_name(uint32_t t) {
  if (auto d = dtype_from_ggml(t)) return std::string(dtype_name(*d));
  // ggml ids this reader does not load (so an error can say what the file holds).
  switch (t) {
    case 9: return "Q8_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    default: return fmt::format("type {}", t);
  }
}

GgufFile::GgufFile(const std::string& path, FileLoad how) : file_(path, how) { parse(); }

void GgufFile::parse() {
  const std::string& p = file_.path();
  Cursor c(p, file_.data(), file_.size());
  const std::byte* magic = c.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) fail("{}: not a GGUF file (magic is not \"GGUF\")", p);
  version_ = c.u32("version");
  if (version_ == 1) fail("{}: GGUF version 1 is not supported (expected 2 or 3)", p);
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0) fail("{}: big-endian GGUF is not supported", p);
    fail("{}: unknown GGUF version {} (expected 2 or 3)", p, version_);
  }
  const uint64_t n_tensors = c.u64("tensor count");
  const uint64_t n_kv = c.u64("metadata count");
  // Every key/value takes at least 8 (key length) + 4 (type) + 1 bytes, every
  // tensor info at least 8 + 4 + 8 + 4 + 8: reject absurd counts up front.
  if (n_kv > c.remaining() / 13) fail("{}: metadata count {} does not fit in the file", p, n_kv);
  if (n_tensors > c.remaining() / 32) fail("{}: tensor count {} does not fit in the file", p, n_tensors);

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key(c.str("metadata key"));
    GgufValue v = read_value(c, p, key);
    if (kv_.count(key)) fail("{}: duplicate metadata key {}", p, printable(key));
    key_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = find("general.alignment")) {
    if (!is_integer(a->type)) wrong_type("general.alignment", *a, "an integer");
    const __int128 al = integer_of(a->type, a->bits);
    if (al <= 0 || al > __int128(kMaxAlignment) || (uint64_t(al) & (uint64_t(al) - 1)) != 0)
      fail("{}: general.alignment {} (expected a power of two up to {})", p, int64_t(al), kMaxAlignment);
    alignment_ = uint64_t(al);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = std::string(c.str("tensor name"));
    const std::string where = p + ": tensor " + printable(t.name);
    const uint32_t n_dims = c.u32("tensor n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) fail("{}: n_dims {} (expected 1..{})", where, n_dims, kMaxDims);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.u64("tensor dimension");
      if (ne == 0 || ne > uint64_t(std::numeric_limits<int64_t>::max()))
        fail("{}: dimension {} is {} (expected 1..2^63-1)", where, d, ne);
      numel = checked_mul(numel, ne, where);
      t.ne.push_back(int64_t(ne));
    }
    if (numel > uint64_t(std::numeric_limits<int64_t>::max())) fail("{}: element count overflows", where);
    t.ggml_type = c.u32("tensor type");
    t.offset = c.u64("tensor offset");
    const auto dtype = dtype_from_ggml(t.ggml_type);
    if (!dtype) fail("{}: unsupported ggml type {} ({})", where, t.ggml_type, ggml_type_name(t.ggml_type));
    if (uint64_t(t.ne[0]) % block_elems(*dtype) != 0)
      fail("{}: row length {} is not a multiple of {}'s block of {}", where, t.ne[0], dtype_name(*dtype),
           block_elems(*dtype));
    if (t.offset % alignment_ != 0)
      fail("{}: data offset {} is not a multiple of the alignment {}", where, t.offset, alignment_);
    t.view.dtype = *dtype;
    t.view.shape.assign(t.ne.rbegin(), t.ne.rend());
    if (tensor_index_.count(t.name)) fail("{}: duplicate tensor name", where);
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = c.pos();
  data_offset_ = checked_add(end_of_infos, (alignment_ - end_of_infos % alignment_) % alignment_, p);
  std::vector<std::pair<uint64_t, size_t>> ranges;  // (begin, index) for the overlap check
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    const std::string where = p + ": tensor " + printable(t.name);
    uint64_t rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) rows = checked_mul(rows, uint64_t(t.ne[d]), where);
    const uint64_t row_bytes = uint64_t(t.ne[0]) / block_elems(t.view.dtype) *
                               (is_block_quantised(t.view.dtype) ? block_bytes(t.view.dtype)
                                                                  : dtype_size(t.view.dtype));
    const uint64_t bytes = checked_mul(rows, row_bytes, where);
    const uint64_t begin = checked_add(data_offset_, t.offset, where);
    const uint64_t end = checked_add(begin, bytes, where);
    if (end > file_.size())
      fail("{}: data [{}, {}) runs past the end of the file ({} bytes; truncated?)", where, begin, end, file_.size());
    t.view.data = file_.data() + begin;
    ranges.emplace_back(t.offset, i);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    const GgufTensorInfo& a = tensors_[ranges[i - 1].second];
    const GgufTensorInfo& b = tensors_[ranges[i].second];
    if (b.offset < a.offset + a.view.nbytes())
      fail("{}: tensors {} and {} overlap", p, printable(a.name), printable(b.name));
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("{}: missing metadata key {}", path(), printable(key));
  return *v;
}

void GgufFile::wrong_type(const std::string& key, const GgufValue& v, std::string_view expected) const {
  if (v.type == GgufType::ARRAY)
    fail("{}: metadata {}: expected {}, got an array of {}", path(), printable(key), expected, gguf_type_name(v.elem));
  fail("{}: metadata {}: expected {}, got {}", path(), printable(key), expected, gguf_type_name(v.type));
}

namespace {
template <typename T>
std::optional<T> integer_as(const GgufValue* v, const GgufFile& f, const std::string& key, std::string_view what) {
  if (!v) return std::nullopt;
  if (!is_integer(v->type)) {
    if (v->type == GgufType::ARRAY)
      fail("{}: metadata {}: expected {}, got an array", f.path(), printable(key), what);
    fail("{}: metadata {}: expected {}, got {}", f.path(), printable(key), what, gguf_type_name(v->type));
  }
  const __int128 x = integer_of(v->type, v->bits);
  if (x < __int128(std::numeric_limits<T>::min()) || x > __int128(std::numeric_limits<T>::max()))
    fail("{}: metadata {}: value {} does not fit {}", f.path(), printable(key),
         is_signed(v->type) ? fmt::format("{}", int64_t(x)) : fmt::format("{}", uint64_t(x)), what);
  return T(x);
}
}  // namespace

std::optional<uint32_t> GgufFile::find_u32(const std::string& k) const { return integer_as<uint32_t>(find(k), *this, k, "u32"); }
std::optional<int32_t> GgufFile::find_i32(const std::string& k) const { return integer_as<int32_t>(find(k), *this, k, "i32"); }
std::optional<uint64_t> GgufFile::find_u64(const std::string& k) const { return integer_as<uint64_t>(find(k), *this, k, "u64"); }
std::optional<int64_t> GgufFile::find_i64(const std::string& k) const { return integer_as<int64_t>(find(k), *this, k, "i64"); }

std::optional<double> GgufFile::find_f64(const std::string& k) const {
  const GgufValue* v = find(k);
  if (!v) return std::nullopt;
  if (v->type != GgufType::F32 && v->type != GgufType::F64) wrong_type(k, *v, "a float");
  return float_of(v->type, v->bits);
}
std::optional<float> GgufFile::find_f32(const std::string& k) const {
  auto d = find_f64(k);
  return d ? std::optional<float>(float(*d)) : std::nullopt;
}
std::optional<bool> GgufFile::find_bool(const std::string& k) const {
  const GgufValue* v = find(k);
  if (!v) return std::nullopt;
  if (v->type != GgufType::BOOL) wrong_type(k, *v, "a bool");
  return v->bits != 0;
}
std::optional<std::string> GgufFile::find_string(const std::string& k) const {
  const GgufValue* v = find(k);
  if (!v) return std::nullopt;
  if (v->type != GgufType::STRING) wrong_type(k, *v, "a string");
  return std::string(v->str);
}

uint32_t GgufFile::get_u32(const std::string& k) const { value(k); return *find_u32(k); }
int32_t GgufFile::get_i32(const std::string& k) const { value(k); return *find_i32(k); }
uint64_t GgufFile::get_u64(const std::string& k) const { value(k); return *find_u64(k); }
int64_t GgufFile::get_i64(const std::string& k) const { value(k); return *find_i64(k); }
float GgufFile::get_f32(const std::string& k) const { value(k); return *find_f32(k); }
double GgufFile::get_f64(const std::string& k) const { value(k); return *find_f64(k); }
bool GgufFile::get_bool(const std::string& k) const { value(k); return *find_bool(k); }
std::string GgufFile::get_string(const std::string& k) const { value(k); return *find_string(k); }

const GgufValue* GgufFile::typed(const std::string& key, bool array) const {
  const GgufValue& v = value(key);
  if (array && v.type != GgufType::ARRAY) wrong_type(key, v, "an array");
  return &v;
}

uint64_t GgufFile::array_size(const std::string& k) const { return typed(k, true)->count; }
GgufType GgufFile::array_type(const std::string& k) const { return typed(k, true)->elem; }

std::vector<std::string> GgufFile::get_string_array(const std::string& k) const {
  const GgufValue* v = typed(k, true);
  if (v->elem != GgufType::STRING) wrong_type(k, *v, "an array of strings");
  return {v->strs.begin(), v->strs.end()};
}

std::vector<float> GgufFile::get_f32_array(const std::string& k) const {
  const GgufValue* v = typed(k, true);
  if (v->elem != GgufType::F32 && v->elem != GgufType::F64) wrong_type(k, *v, "an array of floats");
  const size_t n = scalar_size(v->elem);
  std::vector<float> out(size_t(v->count));
  for (size_t i = 0; i < out.size(); ++i) out[i] = float(float_of(v->elem, load_bits(v->elems + i * n, n)));
  return out;
}

std::vector<int64_t> GgufFile::get_i64_array(const std::string& k) const {
  const GgufValue* v = typed(k, true);
  if (!is_integer(v->elem)) wrong_type(k, *v, "an array of integers");
  const size_t n = scalar_size(v->elem);
  std::vector<int64_t> out(size_t(v->count));
  for (size_t i = 0; i < out.size(); ++i) {
    const __int128 x = integer_of(v->elem, load_bits(v->elems + i * n, n));
    if (x > __int128(std::numeric_limits<int64_t>::max()))
      fail("{}: metadata {}[{}]: value does not fit i64", path(), printable(k), i);
    out[i] = int64_t(x);
  }
  return out;
}

std::vector<int32_t> GgufFile::get_i32_array(const std::string& k) const {
  std::vector<int64_t> wide = get_i64_array(k);
  std::vector<int32_t> out(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < std::numeric_limits<int32_t>::min() || wide[i] > std::numeric_limits<int32_t>::max())
      fail("{}: metadata {}[{}]: value {} does not fit i32", path(), printable(k), i, wide[i]);
    out[i] = int32_t(wide[i]);
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorView& GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) fail("{}: missing tensor {}", path(), name);
  return t->view;
}

}  // namespace ptllm
