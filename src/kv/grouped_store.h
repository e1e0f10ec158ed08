// Grouped KIVI storage (the KIVI paper's layout) of one layer's K or V. Attention
// reads it without dequantising: sinks and residual are fp32 rows, the
// quantised groups go to the fused kernels of ops/kivi_kernels.h.
//
// Per head, the stored tokens are, in slot order:
//
//   [ sinks: first `sink` tokens ][ quantised groups ][ residual: newest tokens ]
//
// Sinks and residual are full-precision rows stored as `resid` (fp32, fp16 or
// bf16; CacheSpec::residual_dtype). fp16/bf16 rows are widened to fp32 before
// any arithmetic (attention, quantising a group); values past the fp16 range
// are saturated to +-65504 when stored, so no inf/NaN is ever held.
//
// A token enters the sinks (while fewer than `sink` are held) or the residual.
// When the residual reaches R + G tokens its oldest G are quantised as one
// group and leave it, so the newest R..R+G-1 tokens are always full precision.
// A quantised token is never touched again: K parameters are per (group,
// channel) over that group's G tokens, V parameters per token; later appends
// do not change them or the codes.
//
// Eviction (StreamingLLM's one-token slide, or a window layer's prefix drop)
// removes the oldest non-sink tokens. Quantised rows (and V's per-token
// parameters) live in a RowRing, so evicting them moves the ring's start and
// copies nothing. A K group that loses some of its tokens is *sliced*: the kept tokens keep their codes and the group's parameters,
// which were chosen over a superset of them and so still cover them. No
// masking, no re-quantisation, and the stored count stays exactly N + M.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_store.h"
#include "ops/kivi_kernels.h"

namespace ptllm {

class GroupedKiviStore : public KVStore {
 public:
  enum class Axis { PerChannel, PerToken };  // K, V
  GroupedKiviStore(Axis axis, kivi::QuantRange r, int64_t n_heads, int64_t capacity, int64_t head_dim, int64_t sink,
                   int64_t group, int64_t residual, DType resid = DType::F32);

  void append(const float* x, int64_t n) override;
  // [begin, end) must start at the first non-sink slot (begin == n_sink()).
  void evict(int64_t begin, int64_t end) override;
  void read(int64_t head, float* out) const override;
  // Attention in place: keys are pre-RoPE and turned by kcos/ksin per slot;
  // `staged` is not used.
  bool reads_in_place() const override { return true; }
  void key_scores(int64_t head, const float* staged, const float* q, int64_t begin, int64_t end, const float* kcos,
                  const float* ksin, float scale, float* scores) const override;
  void value_sum(int64_t head, const float* staged, const float* p, int64_t len, float* out) const override;
  size_t payload_bytes() const override;
  size_t scale_bytes() const override;
  void clear() override;

  Axis axis() const { return axis_; }
  kivi::QuantRange range() const { return r_; }
  int64_t group() const { return group_; }
  int64_t n_sink() const { return n_sink_; }
  int64_t n_quant() const { return n_quant_; }
  int64_t n_resid() const { return n_res_; }
  // Tokens in each quantised K group, oldest first (the oldest may be sliced).
  const std::vector<int64_t>& group_sizes() const { return group_len_; }
  // Packed codes of quantised token t (0 = oldest) of `head`: row_bytes() bytes.
  const uint8_t* code_row(int64_t head, int64_t t) const {
    return codes_.data() + size_t(head * capacity_ + qring_.phys(t)) * row_;
  }
  size_t row_bytes() const { return row_; }
  // K: parameters of group g, [head_dim]. V: parameters of quantised token t.
  const kivi::AffineParams* group_params(int64_t head, int64_t g) const {
    return params_.data() + size_t((head * max_groups_ + g) * head_dim_);
  }
  const kivi::AffineParams& token_params(int64_t head, int64_t t) const {
    return params_[size_t(head * capacity_ + qring_.phys(t))];
  }
  DType resid_dtype() const { return rdt_; }
  // Sink / residual rows [j, j + n) of `head` as fp32: the rows themselves
  // (fp32) or widened into `tmp` ([n, head_dim]).
  const float* sink_rows(int64_t head, int64_t j, int64_t n, float* tmp) const {
    return full_rows(sink_, head * sink_cap_ + j, n, tmp);
  }
  const float* resid_rows(int64_t head, int64_t j, int64_t n, float* tmp) const {
    return full_rows(res_, head * res_cap_ + j, n, tmp);
  }

 private:
  void flush_group();  // quantises the oldest G residual tokens
  // The quantised rows of `head` as the kernels see them (ops/kivi_kernels.h).
  ops::KiviCodes codes(int64_t head) const;
  const float* full_rows(const std::vector<uint8_t>& buf, int64_t row, int64_t n, float* tmp) const;
  void put_row(std::vector<uint8_t>& buf, int64_t row, const float* x);

  Axis axis_;
  kivi::QuantRange r_;
  int64_t sink_cap_, group_, residual_, res_cap_, max_groups_;
  size_t row_;
  int64_t n_sink_ = 0, n_quant_ = 0, n_res_ = 0;
  RowRing qring_;                          // quantised rows: count == n_quant_
  DType rdt_;                              // sink/residual rows: F32, F16 or BF16
  size_t esz_;                             // bytes per sink/residual element
  std::vector<uint8_t> sink_, res_;        // [n_heads, sink_cap, hd], [n_heads, res_cap, hd] of rdt_
  std::vector<uint8_t> codes_;             // [n_heads, capacity, row], rows in qring_ order
  std::vector<kivi::AffineParams> params_; // K: [n_heads, max_groups, hd]; V: [n_heads, capacity] like codes_
  std::vector<int64_t> group_len_;         // K: tokens per live group, oldest first
};

}  // namespace ptllm
