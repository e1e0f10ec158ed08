// Reference (scalar) dequantisation and quantisation of ggml's block types,
// the whole-tensor quantiser, and the int8 activation quantiser shared by
// every ISA level. The K-type scale searches are in quant_kquant.cc.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/quant.h"
#include "ops/quant_impl.h"

namespace ptllm::ops {
namespace q {
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t nb);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t nb);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t nb);
}  // namespace q

namespace {
using namespace q;

float h2f(uint16_t h) { return f16_to_f32(h); }

void check_row(const char* what, DType t, int64_t n) {
  if (!is_block_quantised(t)) fail("{}: {} is not a block-quantised dtype", what, dtype_name(t));
  if (row_group(t) != 1)
    fail("{}: {} interleaves its rows in groups of {}: a row is not contiguous (ops::row_to_f32 reads one)", what,
         dtype_name(t), row_group(t));
  if (n < 0 || n % int64_t(block_elems(t)) != 0)
    fail("{}: {} elements is not a multiple of {}'s block of {}", what, n, dtype_name(t), block_elems(t));
}

// ---------- dequantisation ----------
void deq_q8_0(const BlockQ8_0* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < 32; ++j) y[j] = d * float(b[i].qs[j]);
  }
}
template <bool kMin, typename B>
void deq_4bit(const B* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d);
    float m = -8.f * d;
    if constexpr (kMin) m = h2f(b[i].m);
    for (int j = 0; j < 16; ++j) {
      if constexpr (kMin) {
        y[j] = float(b[i].qs[j] & 15) * d + m;
        y[j + 16] = float(b[i].qs[j] >> 4) * d + m;
      } else {
        y[j] = float((b[i].qs[j] & 15) - 8) * d;
        y[j + 16] = float((b[i].qs[j] >> 4) - 8) * d;
      }
    }
  }
}
template <bool kMin, typename B>
void deq_5bit(const B* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = h2f(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[i].qs[j] & 15) | int((qh >> j) & 1) << 4;
      const int q1 = (b[i].qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
      if constexpr (kMin) {
        const float m = h2f(b[i].m);
        y[j] = float(q0) * d + m;
        y[j + 16] = float(q1) * d + m;
      } else {
        y[j] = float(q0 - 16) * d;
        y[j + 16] = float(q1 - 16) * d;
      }
    }
  }
}
template <bool kFive, typename B>
void deq_k(const B* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    uint8_t sc[8], m[8];
    k4_scales(b[i].scales, sc, m);
    for (int c = 0; c < 4; ++c) {
      const uint8_t* qs = b[i].qs + 32 * c;
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * c + half;
        const float ds = d * float(sc[s]), ms = dmin * float(m[s]);
        for (int l = 0; l < 32; ++l, ++y) {
          int qv = half ? qs[l] >> 4 : qs[l] & 15;
          if constexpr (kFive) qv |= ((b[i].qh[l] >> s) & 1) << 4;
          *y = ds * float(qv) - ms;
        }
      }
    }
  }
}
void deq_q6_k(const BlockQ6_K* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int e0 = (ql[l] & 15) | ((qh[l] >> 0) & 3) << 4;
        const int e1 = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4;
        const int e2 = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
        const int e3 = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        const int s = l / 16;
        y[l] = d * float(sc[s]) * float(e0 - 32);
        y[l + 32] = d * float(sc[s + 2]) * float(e1 - 32);
        y[l + 64] = d * float(sc[s + 4]) * float(e2 - 32);
        y[l + 96] = d * float(sc[s + 6]) * float(e3 - 32);
      }
    }
  }
}

// ---------- quantisation, ggml's round-to-nearest conventions ----------
// Signed value of largest magnitude (the first one on ties), as ggml picks it.
float signed_absmax(const float* x, int n) {
  float amax = 0.f, max = 0.f;
  for (int j = 0; j < n; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}
void q_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) y[i].qs[j] = int8_t(std::round(x[j] * id));  // half away from zero
  }
}
// Q4_0 / Q5_0: d = max / -2^(bits-1), q = min(2^bits - 1, trunc(x / d + 2^(bits-1) + 0.5)).
template <int kBits, typename B>
void q_sym(const float* x, B& y) {
  constexpr int kHalf = 1 << (kBits - 1), kMax = (1 << kBits) - 1;
  const float d = signed_absmax(x, 32) / -float(kHalf), id = d != 0.f ? 1.f / d : 0.f;
  y.d = f32_to_f16(d);
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(kMax, int(int8_t(x[j] * id + (float(kHalf) + 0.5f))));
    const int q1 = std::min(kMax, int(int8_t(x[j + 16] * id + (float(kHalf) + 0.5f))));
    y.qs[j] = uint8_t((q0 & 15) | (q1 & 15) << 4);
    h |= uint32_t(q0 >> 4 & 1) << j | uint32_t(q1 >> 4 & 1) << (j + 16);
  }
  if constexpr (kBits == 5) std::memcpy(y.qh, &h, 4);
}
// Q4_1 / Q5_1: d = (max - min) / (2^bits - 1), m = min, q = trunc((x - min) / d + 0.5).
template <int kBits, typename B>
void q_affine(const float* x, B& y) {
  constexpr int kMax = (1 << kBits) - 1;
  float mn = x[0], mx = x[0];
  for (int j = 1; j < 32; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const float d = (mx - mn) / float(kMax), id = d != 0.f ? 1.f / d : 0.f;
  y.d = f32_to_f16(d);
  y.m = f32_to_f16(mn);
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    const int q0 = std::min(kMax, int(uint8_t((x[j] - mn) * id + 0.5f)));
    const int q1 = std::min(kMax, int(uint8_t((x[j + 16] - mn) * id + 0.5f)));
    y.qs[j] = uint8_t((q0 & 15) | (q1 & 15) << 4);
    h |= uint32_t(q0 >> 4 & 1) << j | uint32_t(q1 >> 4 & 1) << (j + 16);
  }
  if constexpr (kBits == 5) std::memcpy(y.qh, &h, 4);
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  check_row("dequantize_row", t, n);
  const int64_t nb = n / int64_t(block_elems(t));
  switch (t) {
    case DType::Q8_0: return deq_q8_0(static_cast<const BlockQ8_0*>(src), nb, dst);
    case DType::Q4_0: return deq_4bit<false>(static_cast<const BlockQ4_0*>(src), nb, dst);
    case DType::Q4_1: return deq_4bit<true>(static_cast<const BlockQ4_1*>(src), nb, dst);
    case DType::Q5_0: return deq_5bit<false>(static_cast<const BlockQ5_0*>(src), nb, dst);
    case DType::Q5_1: return deq_5bit<true>(static_cast<const BlockQ5_1*>(src), nb, dst);
    case DType::Q4_K: return deq_k<false>(static_cast<const BlockQ4_K*>(src), nb, dst);
    case DType::Q5_K: return deq_k<true>(static_cast<const BlockQ5_K*>(src), nb, dst);
    case DType::Q6_K: return deq_q6_k(static_cast<const BlockQ6_K*>(src), nb, dst);
    default: break;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  check_row("quantize_row", t, n);
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(src[i])) fail("quantize_row: element {} is not finite ({})", i, src[i]);
  const int64_t nb = n / int64_t(block_elems(t));
  switch (t) {
    case DType::Q8_0: return q_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q4_0:
      for (int64_t i = 0; i < nb; ++i) q_sym<4>(src + 32 * i, static_cast<BlockQ4_0*>(dst)[i]);
      return;
    case DType::Q5_0:
      for (int64_t i = 0; i < nb; ++i) q_sym<5>(src + 32 * i, static_cast<BlockQ5_0*>(dst)[i]);
      return;
    case DType::Q4_1:
      for (int64_t i = 0; i < nb; ++i) q_affine<4>(src + 32 * i, static_cast<BlockQ4_1*>(dst)[i]);
      return;
    case DType::Q5_1:
      for (int64_t i = 0; i < nb; ++i) q_affine<5>(src + 32 * i, static_cast<BlockQ5_1*>(dst)[i]);
      return;
    case DType::Q4_K: return q::quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q5_K: return q::quantize_row_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case DType::Q6_K: return q::quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    default: break;
  }
}

size_t quantized_bytes(DType t, int64_t rows, int64_t cols) {
  check_row("quantized_bytes", t, cols);
  if (rows < 0) fail("quantized_bytes: negative row count {}", rows);
  return size_t(rows) * storage_bytes(t, size_t(cols));
}

void quantize_tensor(DType t, const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst) {
  const size_t row_bytes = quantized_bytes(t, rows, cols) / size_t(std::max<int64_t>(rows, 1));
  if (src_dtype != DType::F32 && src_dtype != DType::F16 && src_dtype != DType::BF16)
    fail("quantize_tensor: source dtype {} is not F32, F16 or BF16", dtype_name(src_dtype));
  const size_t src_row = size_t(cols) * dtype_size(src_dtype);
  // One bad row must not escape an OpenMP region as an exception: the first
  // error message is kept and rethrown after the loop.
  std::string error;
#pragma omp parallel
  {
    std::vector<float> row(src_dtype == DType::F32 ? 0 : size_t(cols));
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      const std::byte* s = static_cast<const std::byte*>(src) + size_t(r) * src_row;
      try {
        const float* f = reinterpret_cast<const float*>(s);
        if (src_dtype != DType::F32) {
          to_f32(s, src_dtype, row.data(), cols);
          f = row.data();
        }
        quantize_row(t, f, static_cast<std::byte*>(dst) + size_t(r) * row_bytes, cols);
      } catch (const Error& e) {
#pragma omp critical(ptllm_quantize_tensor)
        if (error.empty()) error = fmt::format("quantize_tensor: row {}: {}", r, e.what());
      }
    }
  }
  if (!error.empty()) throw Error(error);
}

// ---------- the _R16 layouts ----------
namespace {
// A block's fields in record order: {offset in the block, bytes}. A 2-byte
// field is 16 x 2 bytes in the record; one of 4k bytes is k 64-byte vectors,
// vector j lane r = bytes 4j .. 4j + 3 of row r's field (core/dtype.h).
struct Field { int off, bytes; };
struct R16Layout { DType base, r16; Field fields[4]; int n_fields; };
constexpr R16Layout kR16[] = {
    {DType::Q8_0, DType::Q8_0_R16, {{0, 2}, {2, 32}}, 2},                      // d, qs
    {DType::Q4_0, DType::Q4_0_R16, {{0, 2}, {2, 16}}, 2},                      // d, qs
    {DType::Q4_K, DType::Q4_K_R16, {{0, 2}, {2, 2}, {4, 12}, {16, 128}}, 4},  // d, dmin, scales, qs
};
const R16Layout* layout_of(DType t) {
  for (const R16Layout& l : kR16)
    if (l.base == t || l.r16 == t) return &l;
  return nullptr;
}
void check_r16(const char* what, const R16Layout* l, DType t, int64_t rows, int64_t cols) {
  if (!l) fail("{}: {} has no 16-row layout (Q8_0, Q4_0 and Q4_K have)", what, dtype_name(t));
  if (rows < 0 || rows % 16 != 0) fail("{}: {} rows is not a multiple of 16", what, rows);
  const int64_t be = int64_t(block_elems(l->base));
  if (cols < 0 || cols % be != 0)
    fail("{}: {} columns is not a multiple of {}'s block of {}", what, cols, dtype_name(l->base), be);
}
// Between rows [r0, r1) of a group's 16 (row-major blocks from rows16, rb
// bytes a row: row r at rows16 + (r - r0) * rb) and the group's records;
// to_rows: unpack.
void relay_group(const R16Layout& l, std::byte* rows16, size_t rb, int64_t nb, std::byte* group, bool to_rows,
                 int r0 = 0, int r1 = 16) {
  const size_t bb = block_bytes(l.base), rec_bytes = 16 * bb;
  for (int64_t i = 0; i < nb; ++i) {
    std::byte* rec = group + size_t(i) * rec_bytes;
    size_t at = 0;
    for (int f = 0; f < l.n_fields; ++f) {
      const Field fd = l.fields[f];
      for (int r = r0; r < r1; ++r) {
        std::byte* blk = rows16 + size_t(r - r0) * rb + size_t(i) * bb + size_t(fd.off);
        if (fd.bytes == 2) {
          to_rows ? std::memcpy(blk, rec + at + 2 * r, 2) : std::memcpy(rec + at + 2 * r, blk, 2);
        } else {
          for (int j = 0; j < fd.bytes / 4; ++j) {
            std::byte* v = rec + at + 64 * size_t(j) + 4 * size_t(r);
            to_rows ? std::memcpy(blk + 4 * j, v, 4) : std::memcpy(v, blk + 4 * j, 4);
          }
        }
      }
      at += 16 * size_t(fd.bytes);
    }
  }
}
}  // namespace

DType rows16_type(DType t) {
  const R16Layout* l = layout_of(t);
  return l ? l->r16 : t;
}
DType rows16_base(DType t) {
  const R16Layout* l = layout_of(t);
  return l ? l->base : t;
}

void pack_rows16(DType t, std::byte* data, int64_t rows, int64_t cols) {
  const R16Layout* l = layout_of(t);
  check_r16("pack_rows16", l && l->base == t ? l : nullptr, t, rows, cols);
  const int64_t nb = cols / int64_t(block_elems(t));
  const size_t rb = size_t(nb) * block_bytes(t), gb = 16 * rb;
#pragma omp parallel
  {
    std::vector<std::byte> scratch(gb);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < rows / 16; ++g) {
      std::byte* grp = data + size_t(g) * gb;
      std::memcpy(scratch.data(), grp, gb);
      relay_group(*l, scratch.data(), rb, nb, grp, /*to_rows=*/false);
    }
  }
}

void unpack_rows16(DType r16, const std::byte* group, int64_t cols, std::byte* dst) {
  const R16Layout* l = layout_of(r16);
  check_r16("unpack_rows16", l && l->r16 == r16 ? l : nullptr, r16, 16, cols);
  const int64_t nb = cols / int64_t(block_elems(r16));
  relay_group(*l, dst, size_t(nb) * block_bytes(r16), nb, const_cast<std::byte*>(group), /*to_rows=*/true);
}

void unpack_row16(DType r16, const std::byte* group, int64_t cols, int row, std::byte* dst) {
  const R16Layout* l = layout_of(r16);
  check_r16("unpack_row16", l && l->r16 == r16 ? l : nullptr, r16, 16, cols);
  if (row < 0 || row >= 16) fail("unpack_row16: row {} of a 16-row group", row);
  const int64_t nb = cols / int64_t(block_elems(r16));
  relay_group(*l, dst, size_t(nb) * block_bytes(r16), nb, const_cast<std::byte*>(group), /*to_rows=*/true, row,
              row + 1);
}

float qdot_row_f32(DType t, const void* row, const float* x, int64_t n) {
  check_row("dot_row", t, n);
  // Dequantise a block group at a time: exact weights, fp32 dot.
  constexpr int64_t kChunk = 1024;  // a multiple of every block size
  alignas(64) float buf[kChunk];
  const size_t chunk_bytes = storage_bytes(t, kChunk);
  float s = 0.f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    dequantize_row(t, static_cast<const std::byte*>(row) + size_t(i / kChunk) * chunk_bytes, buf, len);
    s += dot_f32(buf, x + i, len);
  }
  return s;
}

namespace q {

// Round-to-nearest-even of x * id, clamped to [-127, 127].
inline int8_t q8(float v) {
  if (!(v == v)) return 0;  // NaN (a non-finite block): its scale is NaN anyway
  return int8_t(std::clamp(round_nearest(v), -127, 127));
}

void quantize_act(DType t, const float* x, int64_t n, std::byte* dst) {
  const int bs = uses_a256(t) ? 256 : 32;
  for (int64_t b = 0; b < n / bs; ++b, x += bs) {
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < bs; ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    // A non-finite activation makes the block's scale NaN, so every output it
    // touches is NaN (as the fp32 product would be) instead of garbage.
    const float d = finite ? amax / 127.f : NAN, id = finite && amax > 0.f ? 127.f / amax : 0.f;
    if (bs == 32) {
      auto* a = reinterpret_cast<A32*>(dst) + b;
      int sum = 0;
      for (int j = 0; j < 32; ++j) sum += (a->qs[j] = q8(x[j] * id));
      a->d = d;
      a->s = d * float(sum);
    } else {
      auto* a = reinterpret_cast<A256*>(dst) + b;
      for (int j = 0; j < 256; ++j) a->qs[j] = q8(x[j] * id);
      for (int k = 0; k < 16; ++k) {
        int sum = 0;
        for (int j = 0; j < 16; ++j) sum += a->qs[16 * k + j];
        a->bsums[k] = int16_t(sum);
      }
      a->d = d;
    }
  }
}

}  // namespace q
}  // namespace ptllm::ops
