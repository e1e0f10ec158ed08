// HF folder / .tinygpt -> GGUF: metadata as llama.cpp's converter writes it,
// tensors converted row by row while they are written (never the whole model
// in memory), llama's wq/wk rows permuted to GGUF's interleaved layout.
#include "model/gguf_convert.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>

#include "core/error.h"
#include "io/mmap.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/quant_iface.h"
#include "ops/ops.h"

namespace ptllm {
namespace {

// Rows per streamed piece: a few hundred KB for the widest real rows.
constexpr int64_t kRowsPerPiece = 64;

void require_block_quant(DType t) {
  if (is_block_quantised(t) && !have_block_quant())
    fail("{} needs the block-quantisation kernels (ops::quantize_row / dequantize_row), not in this build yet",
         dtype_name(t));
}

// Llama 3 scaling as the per-frequency divisors llama.cpp keeps in rope_freqs.
std::vector<float> llama3_freq_factors(const RopeConfig& r, int64_t head_dim) {
  std::vector<float> out(size_t(head_dim / 2));
  const double old_ctx = double(r.original_max_position);
  const double low_wavelen = old_ctx / r.low_freq_factor, high_wavelen = old_ctx / r.high_freq_factor;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(r.theta, double(2 * i) / double(head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    double factor = 1.0;
    if (wavelen > low_wavelen) {
      factor = r.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      factor = 1.0 / ((1 - smooth) / r.factor + smooth);
    }
    out[size_t(i)] = float(factor);
  }
  return out;
}

// Rows and columns of a tensor as encode_rows sees it (1-D = one row).
int64_t cols_of(const TensorView& t) { return t.shape.size() == 1 ? t.shape[0] : t.cols(); }

}  // namespace

void encode_rows(const TensorView& src, int64_t row0, int64_t n_rows, DType type, std::byte* out,
                 const std::function<int64_t(int64_t)>& row_of) {
  const int64_t cols = cols_of(src);
  const size_t in_row = storage_bytes(src.dtype, size_t(cols)), out_row = storage_bytes(type, size_t(cols));
  std::vector<float> f(static_cast<size_t>(cols));
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t r = row_of ? row_of(row0 + i) : row0 + i;
    const std::byte* p = src.data + size_t(r) * in_row;
    std::byte* o = out + size_t(i) * out_row;
    if (src.dtype == type) {
      std::memcpy(o, p, in_row);
      continue;
    }
    if (is_block_quantised(src.dtype)) {
      require_block_quant(src.dtype);
      ops::dequantize_row(src.dtype, p, f.data(), cols);
    } else {
      ops::to_f32(p, src.dtype, f.data(), cols);
    }
    switch (type) {
      case DType::F32: std::memcpy(o, f.data(), size_t(cols) * 4); break;
      case DType::F16:
        for (int64_t j = 0; j < cols; ++j) {
          const uint16_t h = f32_to_f16(f[size_t(j)]);
          std::memcpy(o + 2 * j, &h, 2);
        }
        break;
      case DType::BF16:
        for (int64_t j = 0; j < cols; ++j) {
          const uint16_t h = f32_to_bf16(f[size_t(j)]);
          std::memcpy(o + 2 * j, &h, 2);
        }
        break;
      default:
        if (!is_block_quantised(type)) fail("cannot encode tensors as {}", dtype_name(type));
        require_block_quant(type);
        ops::quantize_row(type, f.data(), o, cols);
    }
  }
}

DType parse_gguf_type(const std::string& s, const std::string& flag) {
  static const std::pair<const char*, DType> types[] = {
      {"f32", DType::F32},   {"f16", DType::F16},   {"bf16", DType::BF16}, {"q8_0", DType::Q8_0},
      {"q4_0", DType::Q4_0}, {"q4_1", DType::Q4_1}, {"q5_0", DType::Q5_0}, {"q5_1", DType::Q5_1},
      {"q4_k", DType::Q4_K}, {"q5_k", DType::Q5_K}, {"q6_k", DType::Q6_K}};
  for (const auto& [n, t] : types)
    if (s == n) return t;
  fail("{} \"{}\": expected one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k", flag,
       s);
}

DType matrix_storage_type(int64_t cols, DType requested) {
  return uint64_t(cols) % block_elems(requested) == 0 ? requested : DType::F16;
}

uint32_t gguf_file_type(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q4_K: return 14;  // Q4_K_S: every weight Q4_K (no K_M mix)
    case DType::Q5_K: return 16;  // Q5_K_S
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: fail("GGUF has no file type for {}", dtype_name(t));
  }
}

void write_gguf_model_metadata(GgufWriter& w, const ModelConfig& c, const std::string& name, DType type) {
  const std::string a = c.family == Family::Qwen2 ? "qwen2" : "llama";
  w.set_string("general.architecture", a);
  w.set_string("general.name", name);
  w.set_u32("general.file_type", gguf_file_type(type));
  if (is_block_quantised(type)) w.set_u32("general.quantization_version", 2);
  w.set_u32(a + ".block_count", uint32_t(c.n_layers));
  w.set_u32(a + ".context_length", uint32_t(c.max_position));
  w.set_u32(a + ".embedding_length", uint32_t(c.hidden_size));
  w.set_u32(a + ".feed_forward_length", uint32_t(c.intermediate_size));
  w.set_u32(a + ".attention.head_count", uint32_t(c.n_heads));
  w.set_u32(a + ".attention.head_count_kv", uint32_t(c.n_kv_heads));
  w.set_f32(a + ".rope.freq_base", float(c.rope.theta));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", float(c.rms_eps));
  w.set_u32(a + ".attention.key_length", uint32_t(c.head_dim));
  w.set_u32(a + ".attention.value_length", uint32_t(c.head_dim));
  w.set_u32(a + ".vocab_size", uint32_t(c.vocab_size));
  w.set_u32(a + ".rope.dimension_count", uint32_t(c.head_dim));
  if (c.rope.type == RopeConfig::Type::Linear) {
    w.set_string(a + ".rope.scaling.type", "linear");
    w.set_f32(a + ".rope.scaling.factor", float(c.rope.factor));
  }
  if (c.sliding_window > 0) w.set_u32(a + ".attention.sliding_window", uint32_t(c.sliding_window));
}

void write_gguf_byte_tokenizer(GgufWriter& w, int64_t vocab_size) {
  if (vocab_size < 259) fail("a byte-fallback vocabulary needs at least 259 tokens, got {}", vocab_size);
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 6 byte
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
  }
  for (int64_t i = 259; i < vocab_size; ++i) {
    tokens.push_back(fmt::format("[unused{}]", i));
    types.push_back(1);
  }
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_f32_array("tokenizer.ggml.scores", std::vector<float>(size_t(vocab_size), 0.f));
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
}

void convert_to_gguf(const std::string& in, const std::string& out_path, const GgufConvertOptions& opt) {
  std::unique_ptr<Model> model;
  std::string tok_json;
  if (is_directory(in)) {
    model = Model::load_hf(in);
    if (file_exists(in + "/tokenizer.json")) tok_json = read_text_file(in + "/tokenizer.json");
  } else if (in.ends_with(".tinygpt")) {
    model = Model::load_tinygpt(in, &tok_json);
  } else {
    fail("{}: expected a Hugging Face model folder or a .tinygpt file", in);
  }
  const ModelConfig& c = model->config();
  if (c.yoco()) fail("{}: a YOCO model has no GGUF (llama.cpp) equivalent", in);
  require_block_quant(opt.type);
  const bool permute = c.family != Family::Qwen2;
  GgufWriter w;
  write_gguf_model_metadata(w, c, std::filesystem::path(in).filename().string(), opt.type);
  if (!opt.write_tokenizer) fail("{}: convert_to_gguf needs a tokenizer writer (GgufConvertOptions)", in);
  opt.write_tokenizer(w, tok_json);

  // rope_freqs first (llama.cpp writes it before the layers), then HF order.
  std::vector<float> factors = c.rope.freq_factors;
  if (c.rope.type == RopeConfig::Type::Llama3) factors = llama3_freq_factors(c.rope, c.head_dim);
  if (!factors.empty()) w.add_tensor("rope_freqs.weight", DType::F32, {int64_t(factors.size())}, factors.data());

  std::vector<std::string> order = {"model.embed_tokens.weight"};
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const char* s : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                          "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
                          "self_attn.v_proj.bias", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      order.push_back(fmt::format("model.layers.{}.{}", l, s));
  order.push_back("model.norm.weight");
  if (!c.tie_embeddings) order.push_back("lm_head.weight");
  const TensorStore& store = model->tensors();
  for (const std::string& hf : order) {
    if (!store.has(hf)) continue;  // biases of models without them
    const TensorView src = store.get(hf);
    const int64_t cols = cols_of(src);
    const DType type = src.shape.size() == 1 ? DType::F32 : matrix_storage_type(cols, opt.type);
    std::function<int64_t(int64_t)> row_of;
    const bool q = hf.find("q_proj") != std::string::npos, k = hf.find("k_proj") != std::string::npos;
    if (permute && (q || k)) {
      // GGUF row r = head h, pair j, half `part` comes from HF row h*hd + part*hd/2 + j.
      const int64_t hd = c.head_dim;
      row_of = [hd](int64_t r) { return r / hd * hd + (r % hd % 2) * (hd / 2) + r % hd / 2; };
    }
    const std::string name = gguf_name_from_hf(hf);
    // A permuted 1-D tensor (a q/k bias) is permuted as rows of one element.
    TensorView s = src;
    if (s.shape.size() == 1 && row_of) s.shape = {s.shape[0], 1};
    w.add_tensor_stream(name, type, src.shape, [s, type, row_of](const GgufWriter::Emit& emit) {
      const int64_t n_rows = s.shape.size() == 1 ? 1 : s.shape[0];
      const size_t row_bytes = storage_bytes(type, size_t(cols_of(s)));
      std::vector<std::byte> buf(size_t(kRowsPerPiece) * row_bytes);
      for (int64_t r = 0; r < n_rows; r += kRowsPerPiece) {
        const int64_t n = std::min(kRowsPerPiece, n_rows - r);
        encode_rows(s, r, n, type, buf.data(), row_of);
        emit(buf.data(), size_t(n) * row_bytes);
      }
    });
  }
  w.write(out_path);
}

}  // namespace ptllm
