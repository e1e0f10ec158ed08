// GGUF reader/writer: a round trip through GgufWriter, the real files in
// shared/ (llama.cpp's stories260K test model and the flagship quantised by
// llama.cpp), and malformed files: every prefix of a valid file, overflowing
// counts, unknown types, out-of-range and misaligned data, bad shapes. Every
// failure must be a one-line ptllm::Error naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/error.h"
#include "io/gguf.h"
#include "test_util.h"

namespace ptllm {
namespace {
using test::error_of;
using test::tmp_path;
using test::read_bytes;
using test::write_bytes;

// Expects GgufFile(path) to throw a one-line Error naming the file and containing `needle`.
void expect_bad(const std::string& path, const std::string& needle) {
  const std::string e = error_of([&] { GgufFile f(path); });
  ASSERT_FALSE(e.empty()) << path << " loaded but should not";
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

// Hand-built GGUF bytes, for files the writer refuses to produce.
struct Raw {
  std::string b;
  Raw& u32(uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); return *this; }
  Raw& u64(uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); return *this; }
  Raw& str(std::string_view s) { u64(s.size()); b.append(s); return *this; }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.append("GGUF", 4);
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t a = 32) { while (b.size() % a) b.push_back('\0'); return *this; }
  Raw& data(size_t n) { b.append(n, '\x11'); return *this; }
};

TEST(Gguf, RoundTripEveryValueTypeAndTensors) {
  const std::string path = tmp_path("roundtrip.gguf");
  std::vector<float> w(6 * 4);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f - 3.f;
  std::vector<uint16_t> h(3 * 8);
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(float(i));
  std::vector<uint16_t> bf(5);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(-float(i));
  std::string q(2 * 2 * block_bytes(DType::Q8_0), '\0');  // [2, 64] Q8_0: 2 rows of 2 blocks
  for (size_t i = 0; i < q.size(); ++i) q[i] = char(i * 7);

  GgufWriter wr;
  wr.set_string("general.architecture", "llama");
  wr.set_u8("t.u8", 200);
  wr.set_i8("t.i8", -100);
  wr.set_u16("t.u16", 60000);
  wr.set_i16("t.i16", -30000);
  wr.set_u32("t.u32", 4000000000u);
  wr.set_i32("t.i32", -2000000000);
  wr.set_u64("t.u64", 18000000000000000000ull);
  wr.set_i64("t.i64", -9000000000000000000ll);
  wr.set_f32("t.f32", 1.5e-5f);
  wr.set_f64("t.f64", 1e300);
  wr.set_bool("t.bool", true);
  wr.set_string("t.empty", "");
  wr.set_string_array("t.strs", {"<unk>", "", "\xe2\x96\x81the", std::string("a\0b", 3)});
  wr.set_f32_array("t.f32s", {0.f, -1.25f, 3e38f});
  wr.set_i32_array("t.i32s", {1, -2, 3});
  wr.set_u32_array("t.u32s", {7, 4000000000u});
  wr.set_i64_array("t.i64s", {-5, 1ll << 40});
  wr.set_u32("t.u32", 42);  // replaced in place
  wr.set_alignment(64);
  wr.add_tensor("w", DType::F32, {6, 4}, w.data());
  wr.add_tensor("h", DType::F16, {3, 8}, h.data());
  wr.add_tensor_stream("bf", DType::BF16, {5}, [&](const GgufWriter::Emit& emit) {
    emit(bf.data(), 4);
    emit(bf.data() + 2, 6);
  });
  wr.add_tensor("q", DType::Q8_0, {2, 64}, q.data());
  wr.write(path);

  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.keys().front(), "general.architecture");
  EXPECT_EQ(f.keys().size(), 19u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("t.u8"), 200u);
  EXPECT_EQ(f.get_i32("t.i8"), -100);
  EXPECT_EQ(f.get_u32("t.u16"), 60000u);
  EXPECT_EQ(f.get_i32("t.i16"), -30000);
  EXPECT_EQ(f.get_u32("t.u32"), 42u);
  EXPECT_EQ(f.value("t.u32").type, GgufType::U32);
  EXPECT_EQ(f.get_i32("t.i32"), -2000000000);
  EXPECT_EQ(f.get_u64("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get_i64("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_f32("t.f32"), 1.5e-5f);
  EXPECT_EQ(f.get_f64("t.f64"), 1e300);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.empty"), "");
  EXPECT_EQ(f.get_string_array("t.strs"),
            (std::vector<std::string>{"<unk>", "", "\xe2\x96\x81the", std::string("a\0b", 3)}));
  EXPECT_EQ(f.array_size("t.strs"), 4u);
  EXPECT_EQ(f.array_type("t.strs"), GgufType::STRING);
  EXPECT_EQ(f.get_f32_array("t.f32s"), (std::vector<float>{0.f, -1.25f, 3e38f}));
  EXPECT_EQ(f.get_i32_array("t.i32s"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_i64_array("t.u32s"), (std::vector<int64_t>{7, 4000000000ll}));
  EXPECT_EQ(f.get_i64_array("t.i64s"), (std::vector<int64_t>{-5, 1ll << 40}));
  EXPECT_EQ(f.get_u32("general.alignment"), 64u);

  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.tensors()[0].name, "w");
  EXPECT_EQ(f.tensors()[0].ne, (std::vector<int64_t>{4, 6}));  // ggml order: innermost first
  const TensorView& tw = f.tensor("w");
  EXPECT_EQ(tw.dtype, DType::F32);
  EXPECT_EQ(tw.shape, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(std::memcmp(tw.data, w.data(), w.size() * 4), 0);
  EXPECT_EQ(f.tensor("h").dtype, DType::F16);
  EXPECT_EQ(std::memcmp(f.tensor("h").data, h.data(), h.size() * 2), 0);
  EXPECT_EQ(f.tensor("bf").dtype, DType::BF16);
  EXPECT_EQ(f.tensor("bf").shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(std::memcmp(f.tensor("bf").data, bf.data(), 10), 0);
  const TensorView& tq = f.tensor("q");
  EXPECT_EQ(tq.dtype, DType::Q8_0);
  EXPECT_EQ(tq.shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(tq.nbytes(), q.size());
  EXPECT_EQ(std::memcmp(tq.data, q.data(), q.size()), 0);
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.view.data) % 64, 0u) << t.name;  // the map is page-aligned
  }
  // The writer pads after the last tensor too (llama.cpp's reader expects it).
  EXPECT_EQ(f.file_size() % 64, 0u);
}

TEST(Gguf, AccessorErrorsNameKeyAndFile) {
  const std::string path = tmp_path("accessors.gguf");
  GgufWriter wr;
  wr.set_i32("neg", -1);
  wr.set_u64("big", 1ull << 40);
  wr.set_string("s", "x");
  wr.set_f32_array("fs", {1.f});
  wr.write(path);
  GgufFile f(path);
  auto has = [&](const std::string& e, const std::string& needle) {
    EXPECT_NE(e.find(needle), std::string::npos) << e;
    EXPECT_NE(e.find(path), std::string::npos) << e;
  };
  has(error_of([&] { f.get_u32("missing.key"); }), "missing metadata key missing.key");
  EXPECT_FALSE(f.find_u32("missing.key").has_value());
  has(error_of([&] { f.get_u32("neg"); }), "neg");
  has(error_of([&] { f.get_u32("big"); }), "does not fit u32");
  EXPECT_EQ(f.get_u64("big"), 1ull << 40);
  has(error_of([&] { f.get_u32("s"); }), "expected u32, got string");
  has(error_of([&] { f.get_string("neg"); }), "expected a string, got i32");
  has(error_of([&] { f.get_f32("s"); }), "expected a float");
  has(error_of([&] { f.get_string_array("fs"); }), "expected an array of strings");
  has(error_of([&] { f.get_f32_array("s"); }), "expected an array");
  has(error_of([&] { f.tensor("nope"); }), "missing tensor nope");
}

TEST(Gguf, WriterRejectsBadTensors) {
  GgufWriter wr;
  float x[4] = {};
  EXPECT_NE(error_of([&] { wr.add_tensor("q", DType::Q8_0, {1, 33}, x); }).find("multiple of"), std::string::npos);
  EXPECT_NE(error_of([&] { wr.add_tensor("z", DType::F32, {0}, x); }).find("non-positive"), std::string::npos);
  EXPECT_NE(error_of([&] { wr.add_tensor("i", DType::I8, {4}, x); }).find("cannot store"), std::string::npos);
  wr.add_tensor("a", DType::F32, {4}, x);
  EXPECT_NE(error_of([&] { wr.add_tensor("a", DType::F32, {4}, x); }).find("twice"), std::string::npos);
  wr.add_tensor_stream("short", DType::F32, {4}, [&](const GgufWriter::Emit& emit) { emit(x, 8); });
  EXPECT_NE(error_of([&] { wr.write(tmp_path("short.gguf")); }).find("produced 8 of its 16 bytes"), std::string::npos);
}

TEST(Gguf, Stories260K) {
  const std::string path = test::shared_dir() + "/models/stories260K/stories260K.gguf";
  GgufFile f(path);
  EXPECT_GE(f.version(), 2u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 5u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 8u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f.array_size("tokenizer.ggml.tokens"), 512u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f.get_f32_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type").size(), 512u);
  const TensorView& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(f.tensor("blk.4.ffn_down.weight").shape[1], f.tensor("blk.4.ffn_up.weight").shape[0]);
  EXPECT_EQ(f.tensors().size(), 3u + 5u * 9u);  // token_embd, output_norm, output, 9 per layer
  EXPECT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens")[1], "<s>");
}

// llama.cpp's own quantisations of the flagship (12 layers, d 256, 8 heads of
// 32, FFN 768, vocab 32000, untied).
void check_flagship(const std::string& file, DType attn_type, DType other_type) {
  const std::string path = test::shared_dir() + "/models/flagship-27m-gguf/" + file;
  GgufFile f(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("llama.block_count"), 12u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 256u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 768u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 8u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 512u);
  EXPECT_EQ(f.array_size("tokenizer.ggml.tokens"), 32000u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_EQ(f.tensors().size(), 3u + 12u * 9u);
  const TensorView& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{256, 256}));
  EXPECT_EQ(q.dtype, attn_type) << dtype_name(q.dtype);
  EXPECT_EQ(f.tensor("blk.3.ffn_gate.weight").shape, (std::vector<int64_t>{768, 256}));
  EXPECT_EQ(f.tensor("blk.3.ffn_down.weight").shape, (std::vector<int64_t>{256, 768}));
  EXPECT_EQ(f.tensor("output.weight").shape, (std::vector<int64_t>{32000, 256}));
  EXPECT_EQ(f.tensor("output_norm.weight").dtype, DType::F32);
  EXPECT_EQ(f.tensor("blk.0.ffn_up.weight").dtype, other_type) << dtype_name(f.tensor("blk.0.ffn_up.weight").dtype);
  // Tensors are packed in order, each at an aligned offset.
  for (const auto& t : f.tensors()) EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
}

TEST(Gguf, FlagshipQ8_0) { check_flagship("flagship-q8_0.gguf", DType::Q8_0, DType::Q8_0); }
TEST(Gguf, FlagshipQ4_0) { check_flagship("flagship-q4_0.gguf", DType::Q4_0, DType::Q4_0); }
TEST(Gguf, FlagshipQ4_K_M) { check_flagship("flagship-q4_k_m.gguf", DType::Q4_K, DType::Q4_K); }

// A small valid file whose data ends exactly at the end of the file (the last
// tensor is a multiple of the alignment), so every shorter prefix is invalid.
std::string small_valid_file() {
  const std::string path = tmp_path("small.gguf");
  GgufWriter wr;
  wr.set_string("general.architecture", "llama");
  wr.set_u32("llama.block_count", 1);
  wr.set_string_array("tokenizer.ggml.tokens", {"a", "bc"});
  wr.set_f32_array("tokenizer.ggml.scores", {0.f, 1.f});
  wr.set_bool("b", false);
  std::vector<float> x(8, 1.f);
  wr.add_tensor("x", DType::F16, {2, 2}, x.data());
  wr.add_tensor("y", DType::F32, {8}, x.data());
  wr.write(path);
  return read_bytes(path);
}

TEST(Gguf, EveryTruncatedPrefixThrows) {
  const std::string full = small_valid_file();
  const std::string path = tmp_path("prefix.gguf");
  write_bytes(path, full);
  { GgufFile ok(path); EXPECT_EQ(ok.tensors().size(), 2u); }
  for (size_t n = 0; n < full.size(); ++n) {
    write_bytes(path, full.substr(0, n));
    const std::string e = error_of([&] { GgufFile f(path); });
    ASSERT_FALSE(e.empty()) << "prefix of " << n << " of " << full.size() << " bytes loaded";
    ASSERT_NE(e.find(path), std::string::npos) << e;
    ASSERT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

TEST(Gguf, CountsThatOverflow) {
  const std::string p = tmp_path("counts.gguf");
  write_bytes(p, Raw().header(0, ~0ull).b);
  expect_bad(p, "metadata count");
  write_bytes(p, Raw().header(1ull << 62, 0).b);
  expect_bad(p, "tensor count");
  // An array of 2^62 u64 elements: count * 8 overflows 64 bits.
  write_bytes(p, Raw().header(0, 1).str("k").u32(9).u32(10).u64(1ull << 62).b);
  expect_bad(p, "overflows");
  write_bytes(p, Raw().header(0, 1).str("k").u32(9).u32(4).u64(1000).b);
  expect_bad(p, "truncated");
  write_bytes(p, Raw().header(0, 1).str("k").u32(9).u32(8).u64(1ull << 60).b);
  expect_bad(p, "strings does not fit");
  // A string length past the end of the file, and one near 2^64.
  write_bytes(p, Raw().header(0, 1).u64(1ull << 40).data(64).b);
  expect_bad(p, "metadata key");
  write_bytes(p, Raw().header(0, 1).str("k").u32(8).u64(~0ull).b);
  expect_bad(p, "truncated");
  // ne product overflows.
  write_bytes(p, Raw().header(1, 0).tensor("t", {1ull << 40, 1ull << 40}, 0, 0).pad().data(64).b);
  expect_bad(p, "overflows");
}

TEST(Gguf, UnknownTypes) {
  const std::string p = tmp_path("types.gguf");
  write_bytes(p, Raw().header(1, 0).tensor("blk.0.attn_q.weight", {32}, 10, 0).pad().data(128).b);
  expect_bad(p, "tensor blk.0.attn_q.weight: unsupported ggml type 10 (Q2_K)");
  write_bytes(p, Raw().header(1, 0).tensor("t", {32}, 1234, 0).pad().data(128).b);
  expect_bad(p, "unsupported ggml type 1234");
  write_bytes(p, Raw().header(0, 1).str("k").u32(13).b);
  expect_bad(p, "unknown value type 13");
  write_bytes(p, Raw().header(0, 1).str("k").u32(9).u32(9).u64(1).b);
  expect_bad(p, "arrays of arrays");
  write_bytes(p, Raw().header(0, 1).str("k").u32(7).b + "\x02");
  expect_bad(p, "bool value 2");
  write_bytes(p, Raw().header(0, 0, 1).b);
  expect_bad(p, "version 1");
  write_bytes(p, Raw().header(0, 0, 7).b);
  expect_bad(p, "unknown GGUF version 7");
  write_bytes(p, Raw().header(0, 0, 0x03000000u).b);
  expect_bad(p, "big-endian");
  write_bytes(p, "GGML" + Raw().u32(3).u64(0).u64(0).b);
  expect_bad(p, "not a GGUF file");
}

TEST(Gguf, TensorDataOutOfRange) {
  const std::string p = tmp_path("range.gguf");
  // 8 f32 = 32 bytes, but only 16 present.
  write_bytes(p, Raw().header(1, 0).tensor("w", {8}, 0, 0).pad().data(16).b);
  expect_bad(p, "tensor w: data");
  expect_bad(p, "runs past the end");
  write_bytes(p, Raw().header(1, 0).tensor("w", {8}, 0, 1ull << 40).pad().data(32).b);
  expect_bad(p, "runs past the end");
  write_bytes(p, Raw().header(1, 0).tensor("w", {8}, 0, ~0ull - 31).pad().data(32).b);
  expect_bad(p, "overflows");
  // Overlapping tensors.
  write_bytes(p, Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad().data(64).b);
  expect_bad(p, "tensors a and b overlap");
}

TEST(Gguf, MisalignedOffsetsAndBadAlignment) {
  const std::string p = tmp_path("align.gguf");
  write_bytes(p, Raw().header(1, 0).tensor("w", {4}, 0, 4).pad().data(64).b);
  expect_bad(p, "tensor w: data offset 4 is not a multiple of the alignment 32");
  write_bytes(p, Raw().header(1, 1).str("general.alignment").u32(4).u32(48).tensor("w", {4}, 0, 0).pad(64).data(64).b);
  expect_bad(p, "general.alignment 48");
  write_bytes(p, Raw().header(0, 1).str("general.alignment").u32(8).str("x").b);
  expect_bad(p, "general.alignment: expected an integer, got string");
  // With alignment 8, offset 8 is fine.
  write_bytes(p, Raw().header(1, 1).str("general.alignment").u32(4).u32(8).tensor("w", {2}, 0, 8).pad(8).data(16).b);
  GgufFile f(p);
  EXPECT_EQ(f.alignment(), 8u);
  EXPECT_EQ(f.tensors()[0].offset, 8u);
  EXPECT_EQ(f.tensor("w").at_f32(0), f.tensor("w").at_f32(1));
}

TEST(Gguf, BadShapes) {
  const std::string p = tmp_path("shape.gguf");
  write_bytes(p, Raw().header(1, 0).tensor("q", {33, 2}, 8, 0).pad().data(256).b);
  expect_bad(p, "tensor q: row length 33 is not a multiple of Q8_0's block of 32");
  write_bytes(p, Raw().header(1, 0).tensor("k", {128}, 12, 0).pad().data(256).b);
  expect_bad(p, "row length 128 is not a multiple of Q4_K's block of 256");
  write_bytes(p, Raw().header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad().data(32).b);
  expect_bad(p, "n_dims 5");
  write_bytes(p, Raw().header(1, 0).tensor("t", {}, 0, 0).pad().data(32).b);
  expect_bad(p, "n_dims 0");
  write_bytes(p, Raw().header(1, 0).tensor("t", {4, 0}, 0, 0).pad().data(32).b);
  expect_bad(p, "dimension 1 is 0");
  write_bytes(p, Raw().header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad().data(64).b);
  expect_bad(p, "duplicate tensor name");
  write_bytes(p, Raw().header(0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(2).b);
  expect_bad(p, "duplicate metadata key k");
  // A name with a newline is escaped: the message stays one line.
  write_bytes(p, Raw().header(1, 0).tensor("a\nb", {4}, 99, 0).pad().data(32).b);
  expect_bad(p, "tensor a\\x0ab");
  // Found by fuzz_gguf: a key with a newline in an unknown-value-type error.
  write_bytes(p, Raw().header(0, 1).str("k\ney").u32(77).data(16).b);
  expect_bad(p, "metadata k\\x0aey: unknown value type 77");
}

}  // namespace
}  // namespace ptllm
