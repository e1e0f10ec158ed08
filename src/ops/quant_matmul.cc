// Matrix products over block-quantised weights: x is quantised once per call
// to int8 activation blocks, then every output row runs the current ISA's
// integer dot kernel. Parallel over blocks of output rows; within a block the
// tokens go kMaxNT at a time, so a weight row is unpacked once per kMaxNT
// tokens while the block (a few KiB) stays in cache.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/uninit_vector.h"
#include "ops/quant.h"
#include "ops/quant_impl.h"

namespace ptllm::ops {
namespace {
using namespace q;

constexpr int64_t kRowBlock = 16;
static_assert(kRowBlock % row_group(DType::Q4_0_R16) == 0 && kRowBlock % row_group(DType::Q4_K_R16) == 0 &&
                  kRowBlock % row_group(DType::Q8_0_R16) == 0,
              "a task holds whole groups of the _R16 types");
// Weight bytes x tokens below which a product runs on one thread (fork/join
// costs a few microseconds).
constexpr int64_t kParallelWork = int64_t(1) << 16;
// Weight bytes x tokens from which a decode product takes guided chunks
// (for_row_blocks says why): about where its weights stop fitting the caches.
constexpr int64_t kGuidedWork = int64_t(2) << 20;

void check_weight(const char* what, const TensorView& w, int64_t in) {
  if (w.shape.size() != 2) fail("{}: weight must be 2-D, got shape {}", what, shape_str(w.shape));
  if (!is_block_quantised(w.dtype)) fail("{}: weight dtype {} is not block-quantised", what, dtype_name(w.dtype));
  if (w.cols() % int64_t(block_elems(w.dtype)) != 0)
    fail("{}: {} weight has {} columns, not a multiple of its block of {}", what, dtype_name(w.dtype), w.cols(),
         block_elems(w.dtype));
  if (w.rows() % row_group(w.dtype) != 0)
    fail("{}: {} weight has {} rows, not a multiple of its groups of {}", what, dtype_name(w.dtype), w.rows(),
         row_group(w.dtype));
  if (w.cols() != in) fail("{}: weights disagree on the input size ({} vs {})", what, w.cols(), in);
  if (!w.data && w.numel() > 0) fail("{}: weight has no data", what);
}

// x [n_tokens, in] quantised for the weight types of one call: A32 rows for
// the 32-element types and A256 rows for the K types, made on first use, and
// for the types the level tiles, the tiles' layout of the A32 rows.
// The buffers are the calling thread's, reused from call to call: a
// prefill's products would otherwise each allocate, zero and fault in a few
// hundred KiB (on this project's VM a first touch costs ~15 us a page). A
// QuantX made while another on the same thread holds them gets its own.
class QuantX {
  struct Buffers {
    uninit_vector<std::byte> a32, a256, tiled[8];
    bool busy = false;
  };

 public:
  QuantX(const float* x, int64_t n_tokens, int64_t in) : x_(x), n_(n_tokens), in_(in) {
    thread_local Buffers mine;
    if (!mine.busy) {
      b_ = &mine;
    } else {
      own_ = std::make_unique<Buffers>();
      b_ = own_.get();
    }
    b_->busy = true;
  }
  ~QuantX() { b_->busy = false; }
  QuantX(const QuantX&) = delete;
  QuantX& operator=(const QuantX&) = delete;

  // Quantises (and re-lays for the tile) each row in one parallel pass.
  void prepare(DType t) {
    t = tile_layout_type(kernels(), t);
    const bool k = uses_a256(t);
    const int ki = kernel_index(t);
    const Kernels& kn = kernels();
    bool& have = k ? have_a256_ : have_a32_;
    const bool quantise = !have, tile = kn.tile[ki] && relaid(t) && !have_tiled_[ki];
    if (!quantise && !tile) return;
    uninit_vector<std::byte>& buf = k ? b_->a256 : b_->a32;
    const size_t stride = act_row_bytes(t, in_);
    if (quantise) buf.resize(std::max(buf.size(), stride * size_t(n_)));
    const int64_t nb = in_ / 32;
    const size_t tstride = tile_row_bytes(nb);
    uninit_vector<std::byte>& tb = b_->tiled[ki];
    if (tile) tb.resize(std::max(tb.size(), tstride * size_t(n_)));
    const ActQuant quant = kn.quantize_act;
#pragma omp parallel for schedule(static) if (n_ * in_ >= kParallelWork)
    for (int64_t r = 0; r < n_; ++r) {
      std::byte* row = buf.data() + size_t(r) * stride;
      if (quantise) quant(t, x_ + r * in_, in_, row);
      if (tile) kn.tile_acts(t, row, nb, tb.data() + size_t(r) * tstride);
    }
    have = true;
    if (tile) have_tiled_[ki] = true;
  }
  const std::byte* data(DType t) const { return uses_a256(t) ? b_->a256.data() : b_->a32.data(); }
  size_t stride(DType t) const { return act_row_bytes(t, in_); }
  // The tiles of the 32-element types take their rows re-laid (TileActs);
  // the K types' tiles read the A256 rows as they are.
  static bool relaid(DType t) { return !uses_a256(t); }
  // Callers pass the layout's type (tile_layout_type) for an _R16 weight.
  const std::byte* tiled(DType t) const { return relaid(t) ? b_->tiled[size_t(kernel_index(t))].data() : data(t); }
  size_t tiled_stride(DType t) const { return relaid(t) ? tile_row_bytes(in_ / 32) : stride(t); }

 private:
  const float* x_;
  int64_t n_, in_;
  Buffers* b_ = nullptr;
  std::unique_ptr<Buffers> own_;
  bool have_a32_ = false, have_a256_ = false, have_tiled_[8] = {};
};

// y[t, o] for o in [r0, r1), every token: y points at row r0's output of
// token 0, so row o of token t goes to y[t * y_stride + o - r0].
// Up to kMaxNT tokens per pass; with the level's tile for this type, up to
// its tile_rows rows per pass too (tile_rows1 for one token: the K types'
// tiles go row by row there, since one token is bound by the weight stream,
// which the kernel prefetches ahead of one row, and with 4 rows in flight
// those prefetches landed in rows already being read); else the row dot,
// one row per pass.
void run_rows(const Kernels& k, const TensorView& w, const QuantX& qx, int64_t n_tokens, float* y, int64_t y_stride,
              const float* bias, int64_t r0, int64_t r1);

// run_rows for the _R16 types: r0 and r1 are multiples of 16 (their tasks
// are kRowBlock = 16 rows). The level's kernel reads the groups as they are;
// without one, each group is unpacked into stored rows and run as those
// (Q4_0_R16's kernel does Q4_0's arithmetic on the same integers, so its
// results are Q4_0's; Q8_0_R16's and Q4_K_R16's sum the same exact integers in another
// fp32 order).
void run_groups(const Kernels& k, const TensorView& w, const QuantX& qx, int64_t n_tokens, float* y,
                int64_t y_stride, const float* bias, int64_t r0, int64_t r1) {
  const DType base = kernel_type(w.dtype);
  const int ki = kernel_index(w.dtype);
  const int64_t in = w.cols(), nb = in / int64_t(block_elems(base));
  const size_t rb = storage_bytes(base, size_t(in)), gb = 16 * rb;
  const GroupDot tile = k.tile_r16[ki];
  if (!tile) {
    std::vector<std::byte> rows16(gb);
    for (int64_t g = r0; g < r1; g += 16) {
      unpack_rows16(w.dtype, w.data + size_t(g) * rb, in, rows16.data());
      TensorView v;
      v.data = rows16.data();
      v.dtype = base;
      v.shape = {16, in};
      run_rows(k, v, qx, n_tokens, y + (g - r0), y_stride, bias ? bias + g : nullptr, 0, 16);
    }
    return;
  }
  // The activations in the tile layout the kernel takes (tile_layout_type).
  const DType lt = tile_layout_type(k, w.dtype);
  const bool tiled = k.tile[kernel_index(lt)] != nullptr;
  const std::byte* xq = tiled ? qx.tiled(lt) : qx.data(base);
  const size_t xs = tiled ? qx.tiled_stride(lt) : qx.stride(base);
  const int64_t gnt = k.group_nt[ki] ? k.group_nt[ki] : kMaxNT;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += gnt) {
    const int nt = int(std::min<int64_t>(gnt, n_tokens - t0));
    for (int64_t g = r0; g < r1; g += 16)
      tile(w.data + size_t(g) * rb, xq + size_t(t0) * xs, xs, nb, nt, bias ? bias + g : nullptr,
           y + t0 * y_stride + (g - r0), y_stride);
  }
}

void run_rows(const Kernels& k, const TensorView& w, const QuantX& qx, int64_t n_tokens, float* y, int64_t y_stride,
              const float* bias, int64_t r0, int64_t r1) {
  if (row_group(w.dtype) != 1) return run_groups(k, w, qx, n_tokens, y, y_stride, bias, r0, r1);
  const int ki = kernel_index(w.dtype);
  const RowDot dot = k.dot[ki];
  const TileDot tile = k.tile[ki];
  const int64_t in = w.cols(), nb = in / int64_t(block_elems(w.dtype));
  const size_t rb = storage_bytes(w.dtype, size_t(in));
  const std::byte* xq = tile ? qx.tiled(w.dtype) : qx.data(w.dtype);
  const size_t xs = tile ? qx.tiled_stride(w.dtype) : qx.stride(w.dtype);
  const int64_t rows_per_pass = !tile ? 1 : n_tokens > 1 ? k.tile_rows[ki] : k.tile_rows1[ki];
  float out[kMaxTileRows * kMaxNT];  // [row][kMaxNT]
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxNT) {
    const int nt = int(std::min<int64_t>(kMaxNT, n_tokens - t0));
    for (int64_t o = r0; o < r1; o += rows_per_pass) {
      const int nr = int(std::min<int64_t>(rows_per_pass, r1 - o));
      const std::byte* wo = w.data + size_t(o) * rb;
      if (tile)
        tile(wo, rb, nr, xq + size_t(t0) * xs, xs, nb, nt, out);
      else
        dot(wo, xq + size_t(t0) * xs, xs, nb, nt, out);
      for (int r = 0; r < nr; ++r) {
        const float bo = bias ? bias[o + r] : 0.f;
        for (int j = 0; j < nt; ++j) y[(t0 + j) * y_stride + (o - r0) + r] = out[r * kMaxNT + j] + bo;
      }
    }
  }
}

// f(0 .. n - 1) over the threads, one row-block task each; `work` (weight
// bytes x tokens) picks the schedule. Several tokens take blocks as threads
// come free: a vCPU the VM holds back does fewer blocks instead of keeping
// the other waiting at the barrier. Decode from DRAM takes guided chunks:
// long runs of consecutive blocks first (each thread's stream runs on into
// its next block, which it prefetches, tile16_t), then ever smaller ones that
// even out the finish (session 18: 1B Q4_0 decode had both threads waiting
// 13-15% of the time in libgomp under the static split). Small decode
// products keep one static hand-out per thread. A block's rows are computed
// the same on any thread, so the schedule changes no result.
template <class F>
void for_row_blocks(int64_t n, int64_t n_tokens, int64_t work, const F& f) {
  if (n_tokens > kMaxNT) {
#pragma omp parallel for schedule(dynamic, 1) if (work >= kParallelWork)
    for (int64_t i = 0; i < n; ++i) f(i);
  } else if (work >= kGuidedWork) {
#pragma omp parallel for schedule(guided)
    for (int64_t i = 0; i < n; ++i) f(i);
  } else {
#pragma omp parallel for schedule(static) if (work >= kParallelWork)
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

std::vector<float> bias_f32(const TensorView* bias, int64_t out) {
  if (!bias) return {};
  if (bias->numel() != out) fail("matmul: bias has {} elements, expected {}", bias->numel(), out);
  std::vector<float> b(static_cast<size_t>(out));
  to_f32(bias->data, bias->dtype, b.data(), out);
  return b;
}

}  // namespace

bool rows16_pays(DType t) {
  return rows16_type(t) != t && kernels().tile_r16[kernel_index(t)] != nullptr;
}

void qmatmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, const TensorView* bias) {
  MatmulJob job{&w, y, bias};
  qmatmul_multi(x, n_tokens, &job, 1);
}

void qmatmul_multi(const float* x, int64_t n_tokens, const MatmulJob* jobs, int n_jobs) {
  if (n_jobs <= 0 || n_tokens <= 0) return;
  const int64_t in = jobs[0].w->cols();
  // Jobs with plain weights (a mixed call) go through the ordinary path.
  std::vector<int> qjobs;
  for (int j = 0; j < n_jobs; ++j) {
    if (!is_block_quantised(jobs[j].w->dtype)) {
      if (jobs[j].w->cols() != in) fail("matmul_multi: weights disagree on the input size ({} vs {})", jobs[j].w->cols(), in);
      matmul(*jobs[j].w, x, n_tokens, jobs[j].y, jobs[j].bias);
      continue;
    }
    check_weight("matmul", *jobs[j].w, in);
    qjobs.push_back(j);
  }
  QuantX qx(x, n_tokens, in);
  std::vector<std::vector<float>> biases(static_cast<size_t>(n_jobs));
  // One task per (job, block of kRowBlock rows).
  std::vector<std::pair<int, int64_t>> tasks;
  int64_t work = 0;
  for (int j : qjobs) {
    qx.prepare(jobs[j].w->dtype);
    biases[size_t(j)] = bias_f32(jobs[j].bias, jobs[j].w->rows());
    for (int64_t o0 = 0; o0 < jobs[j].w->rows(); o0 += kRowBlock) tasks.emplace_back(j, o0);
    work += int64_t(storage_bytes(jobs[j].w->dtype, size_t(jobs[j].w->numel()))) * n_tokens;
  }
  const Kernels& k = kernels();
  const auto task = [&](size_t i) {
    const MatmulJob& jb = jobs[tasks[i].first];
    const int64_t out = jb.w->rows(), o0 = tasks[i].second;
    const std::vector<float>& b = biases[size_t(tasks[i].first)];
    run_rows(k, *jb.w, qx, n_tokens, jb.y + o0, out, b.empty() ? nullptr : b.data(), o0, std::min(out, o0 + kRowBlock));
  };
  for_row_blocks(int64_t(tasks.size()), n_tokens, work, [&](int64_t i) { task(size_t(i)); });
}

void qmatmul_swiglu(const TensorView& w_gate, const TensorView& w_up, const float* x, int64_t n_tokens, float* gate,
                    float* up) {
  if (w_gate.shape != w_up.shape)
    fail("matmul_swiglu: gate {} and up {} shapes differ", shape_str(w_gate.shape), shape_str(w_up.shape));
  if (n_tokens <= 0) return;
  if (!is_block_quantised(w_gate.dtype) || !is_block_quantised(w_up.dtype)) {
    matmul(w_gate, x, n_tokens, gate);
    matmul(w_up, x, n_tokens, up);
    silu_mul(gate, up, n_tokens * w_gate.rows());
    return;
  }
  const int64_t F = w_gate.rows(), in = w_gate.cols();
  check_weight("matmul_swiglu", w_gate, in);
  check_weight("matmul_swiglu", w_up, in);
  QuantX qx(x, n_tokens, in);
  qx.prepare(w_gate.dtype);
  qx.prepare(w_up.dtype);
  const Kernels& k = kernels();
  const int64_t n_blocks = (F + kRowBlock - 1) / kRowBlock;
  const int64_t work = int64_t(w_gate.nbytes() + w_up.nbytes()) * n_tokens;
  // A task owns a block of ffn rows in both matrices, so its SwiGLU needs no barrier.
  // Several tokens' rows go to the thread's own [n_tokens][kRowBlock] gate and up
  // blocks, whose SwiGLU is one contiguous pass, and only the result is copied
  // into gate. Written straight into gate/up ([n_tokens][F]), a task's 16-float
  // slices lie F floats apart (32 KiB at the 1B shape's 8,192): they share a few
  // cache sets, were evicted before SwiGLU read them back, and its loads
  // missed (perf: silu_mul 4.5% of a 1B Q4_0 prefill, 54% of it on one load).
  // `up` stays untouched scratch then. Elementwise, so the same bits.
  // One token's rows are contiguous in gate/up already and are computed there.
  const auto task = [&](int64_t p) {
    const int64_t o0 = p * kRowBlock, o1 = std::min(F, o0 + kRowBlock), nr = o1 - o0;
    float* g = gate + o0;
    float* u = up + o0;
    int64_t stride = F;
    if (n_tokens > 1) {
      thread_local uninit_vector<float> block;
      if (block.size() < size_t(2 * n_tokens * kRowBlock)) block.resize(size_t(2 * n_tokens * kRowBlock));
      g = block.data();
      u = g + n_tokens * nr;
      stride = nr;
    }
    run_rows(k, w_gate, qx, n_tokens, g, stride, nullptr, o0, o1);
    run_rows(k, w_up, qx, n_tokens, u, stride, nullptr, o0, o1);
    silu_mul(g, u, n_tokens * nr);
    if (n_tokens > 1)
      for (int64_t t = 0; t < n_tokens; ++t) std::memcpy(gate + t * F + o0, g + t * nr, size_t(nr) * sizeof(float));
  };
  for_row_blocks(n_blocks, n_tokens, work, task);
}

}  // namespace ptllm::ops
