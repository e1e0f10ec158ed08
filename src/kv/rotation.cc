#include "kv/rotation.h"

#include <cmath>

#include "core/error.h"

namespace ptllm {

void walsh_hadamard(float* x, int64_t n) {
  for (int64_t len = 1; len < n; len <<= 1)
    for (int64_t i = 0; i < n; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}

HadamardRotation::HadamardRotation(int64_t n, uint64_t seed) : n_(n), sign_(size_t(n)) {
  if (!valid_size(n)) fail("Hadamard rotation: size {} (expected a power of two)", n);
  // splitmix64: a fixed, platform-independent sign sequence per seed.
  uint64_t z = seed;
  for (int64_t i = 0; i < n; ++i) {
    z += 0x9e3779b97f4a7c15ull;
    uint64_t r = z;
    r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
    r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
    r ^= r >> 31;
    sign_[size_t(i)] = (r >> 63) ? -1.f : 1.f;
  }
}

void HadamardRotation::forward(float* x) const {
  for (int64_t i = 0; i < n_; ++i) x[i] *= sign_[size_t(i)];
  walsh_hadamard(x, n_);
  const float s = 1.0f / std::sqrt(float(n_));
  for (int64_t i = 0; i < n_; ++i) x[i] *= s;
}

void HadamardRotation::inverse(float* x) const {
  // H is symmetric and H H = n I: M^T = D H / sqrt(n).
  walsh_hadamard(x, n_);
  const float s = 1.0f / std::sqrt(float(n_));
  for (int64_t i = 0; i < n_; ++i) x[i] *= s * sign_[size_t(i)];
}

}  // namespace ptllm
