#include "kv/quant.h"

#include <cmath>

namespace ptllm::kivi {

AffineParams choose_params(float min, float max, QuantRange r) {
  AffineParams p;
  p.zero = Half::round_down(min);
  // Measured from the stored zero, so that the stored zero + levels * scale still reaches max.
  float s = (max - p.zero.widen()) / float(r.levels());
  if (!(s >= kScaleFloor)) s = kScaleFloor;  // zero range, or NaN input
  p.scale = Half::round_up(s);
  return p;
}

void pack_row(const uint8_t* u, int64_t n, QuantRange r, uint8_t* dst) {
  if (r.bits == 8) {
    for (int64_t i = 0; i < n; ++i) dst[i] = u[i];
    return;
  }
  if (r.bits == 3) {
    const size_t nb = row_bytes(n, r);
    for (size_t j = 0; j < nb; ++j) dst[j] = 0;
    for (int64_t i = 0; i < n; ++i) set_code(dst, i, u[i], r);
    return;
  }
  if (r.bits == 2) {
    for (int64_t j = 0; 4 * j < n; ++j) {
      uint8_t b = 0;
      for (int64_t k = 0; k < 4 && 4 * j + k < n; ++k) b = uint8_t(b | ((u[4 * j + k] & 0x03) << (2 * k)));
      dst[j] = b;
    }
    return;
  }
  for (int64_t j = 0; 2 * j < n; ++j) {
    const uint8_t lo = u[2 * j] & 0x0f;
    const uint8_t hi = 2 * j + 1 < n ? uint8_t(u[2 * j + 1] & 0x0f) : 0;
    dst[j] = uint8_t(lo | (hi << 4));
  }
}

uint8_t code_at(const uint8_t* row, int64_t i, QuantRange r) {
  if (r.bits == 8) return row[i];
  if (r.bits == 2) return uint8_t((row[i / 4] >> (2 * (i & 3))) & 0x03);
  if (r.bits == 3) return int3_code(row, i);
  const uint8_t b = row[i / 2];
  return (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0x0f);
}

void set_code(uint8_t* row, int64_t i, uint8_t u, QuantRange r) {
  if (r.bits == 8) {
    row[i] = u;
    return;
  }
  if (r.bits == 3) {
    // Bits 3i..3i+2 of the row, possibly across two bytes.
    const int64_t bit = 3 * i, byte = bit >> 3;
    const int sh = int(bit & 7);
    const unsigned m = 7u << sh, v = unsigned(u & 7u) << sh;
    row[byte] = uint8_t((row[byte] & ~m) | (v & 0xffu));
    if (sh > 5) row[byte + 1] = uint8_t((row[byte + 1] & ~(m >> 8)) | (v >> 8));
    return;
  }
  if (r.bits == 2) {
    uint8_t& b = row[i / 4];
    const int sh = int(2 * (i & 3));
    b = uint8_t((b & ~(0x03 << sh)) | ((u & 0x03) << sh));
    return;
  }
  uint8_t& b = row[i / 2];
  b = (i & 1) ? uint8_t((b & 0x0f) | ((u & 0x0f) << 4)) : uint8_t((b & 0xf0) | (u & 0x0f));
}

void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const float* __restrict scale,
                    const float* __restrict zero, float* __restrict out) {
  uint8_t tmp[1024];
  const uint8_t* __restrict u = unpack_row(row, n, r, tmp);
  for (int64_t i = 0; i < n; ++i) out[i] = float(u[i]) * scale[i] + zero[i];
}

void dequantise_row(const uint8_t* row, int64_t n, QuantRange r, const WideParams& w, float* __restrict out) {
  uint8_t tmp[1024];
  const uint8_t* __restrict u = unpack_row(row, n, r, tmp);
  const float s = w.scale, z = w.zero;
  for (int64_t i = 0; i < n; ++i) out[i] = float(u[i]) * s + z;
}

void code_range(const uint8_t* rows, int64_t n_rows, size_t stride, int64_t n, QuantRange r, uint8_t* umin,
                uint8_t* umax) {
  uint8_t tmp[1024];
  for (int64_t t = 0; t < n_rows; ++t) {
    const uint8_t* __restrict u = unpack_row(rows + size_t(t) * stride, n, r, tmp);
    for (int64_t c = 0; c < n; ++c) {
      umin[c] = u[c] < umin[c] ? u[c] : umin[c];
      umax[c] = u[c] > umax[c] ? u[c] : umax[c];
    }
  }
}

}  // namespace ptllm::kivi
