// A fixed, seeded, data-oblivious orthogonal rotation of one KV head's
// vectors (issue 16, `rotate hadamard`): the randomised Hadamard transform
//
//   M = H D / sqrt(n),   H the n x n Walsh-Hadamard matrix (n a power of two),
//   D = diag(s), s_i in {+1, -1} drawn from a fixed seed per (layer, KV head),
//
// applied in place in O(n log n) (fast Walsh-Hadamard transform). M is
// orthogonal (M^T M = I), so (M q) . (M k) = q . k and sum_t p_t M v_t =
// M (sum_t p_t v_t): the cache stores M k and M v, turns the query by M and
// the attention output by M^T = D H / sqrt(n). Quantising M k instead of k
// spreads outlier channels over every channel (QuaRot-style).
#pragma once
#include <cstdint>
#include <vector>

namespace ptllm {

class HadamardRotation {
 public:
  HadamardRotation() = default;
  // n must be a power of two (callers check, kv/storage_cache.cc reports it).
  HadamardRotation(int64_t n, uint64_t seed);
  static bool valid_size(int64_t n) { return n >= 1 && (n & (n - 1)) == 0; }
  int64_t size() const { return n_; }
  // x := M x (forward) or x := M^T x (inverse), x [n].
  void forward(float* x) const;
  void inverse(float* x) const;
  const std::vector<float>& signs() const { return sign_; }

 private:
  int64_t n_ = 0;
  std::vector<float> sign_;  // s_i, +-1
};

// Unnormalised fast Walsh-Hadamard transform of x [n], n a power of two.
void walsh_hadamard(float* x, int64_t n);

}  // namespace ptllm
