// Rotary position embedding in the Hugging Face "rotate-half" layout: element i
// of a head is paired with element i + head_dim/2 (llama2.c / GGUF pair i with
// i+1 instead; weights converted from those formats must be permuted first).
#pragma once
#include <cstdint>
#include <vector>


namespace ptllm {

// RoPE hyper-parameters as config.json states them.
struct RopeConfig {
  enum class Type { Default, Linear, Llama3 };
  Type type = Type::Default;
  double theta = 10000.0;
  double factor = 1.0;                   // linear & llama3
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  int64_t original_max_position = 8192;  // llama3
  // [head_dim/2] divisors of each inverse frequency after the scaling above
  // (GGUF's rope_freqs tensor, how llama.cpp stores Llama 3 scaling); empty = none.
  std::vector<float> freq_factors;
};

constexpr int64_t kMaxHeadDim = 512;

class Rope {
 public:
  Rope() = default;
  Rope(const RopeConfig& cfg, int64_t head_dim);  // head_dim <= kMaxHeadDim

  int64_t head_dim() const { return head_dim_; }
  // cos/sin of every frequency at `pos`: each [head_dim/2].
  void cos_sin(double pos, float* cos, float* sin) const;
  // Rotates x [n_heads, head_dim] by precomputed cos/sin.
  void apply(float* x, int64_t n_heads, const float* cos, const float* sin) const;
  // Rotates x [n_heads, head_dim] to position pos.
  void apply(float* x, int64_t n_heads, double pos) const;
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  int64_t head_dim_ = 0;
  std::vector<double> inv_freq_;  // [head_dim/2], scaling already applied
};

}  // namespace ptllm
