// safetensors and config.json: well-formed files load; every malformed one is
// a one-line Error naming the file and what was expected.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/model.h"
#include "test_util.h"

namespace ptllm {
namespace {
namespace fs = std::filesystem;
using test::error_of;

std::string tmpdir() {
  auto d = fs::temp_directory_path() / ("ptllm_io_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d.string();
}

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f << std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripWrite) {
  const std::string p = tmpdir() + "/rt.safetensors";
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  write_safetensors(p, {{"a", DType::F32, {2, 3}, a.data()}});
  TensorStore s;
  s.add_file(p);
  const auto& t = s.get("a");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.as<float>()[5], 6.f);
}

TEST(Safetensors, TruncatedFile) {
  const std::string p = tmpdir() + "/trunc.safetensors";
  { std::ofstream f(p, std::ios::binary); f << "abc"; }
  EXPECT_NE(error_of([&] { TensorStore().add_file(p); }).find("truncated"), std::string::npos);
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  auto e = error_of([&] { TensorStore().add_file(p); });
  EXPECT_NE(e.find("outside"), std::string::npos) << e;
  EXPECT_NE(e.find(p), std::string::npos) << e;
}

TEST(Safetensors, HeaderLengthBeyondFile) {
  const std::string p = tmpdir() + "/hl.safetensors";
  std::ofstream f(p, std::ios::binary);
  uint64_t n = 1ull << 40;
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << "{}";
  f.close();
  EXPECT_NE(error_of([&] { TensorStore().add_file(p); }).find("truncated"), std::string::npos);
}

TEST(Safetensors, OffsetsInconsistentWithShape) {
  const std::string p = tmpdir() + "/shape.safetensors";
  write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(error_of([&] { TensorStore().add_file(p); }).find("expected 12"), std::string::npos);
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}})", 16);
  EXPECT_NE(error_of([&] { TensorStore().add_file(p); }).find("overflow"), std::string::npos);
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,4]}})", 16);
  EXPECT_NE(error_of([&] { TensorStore().add_file(p); }).find("outside"), std::string::npos);
}

TEST(Safetensors, UnsupportedDtypeListsSupported) {
  const std::string p = tmpdir() + "/dt.safetensors";
  write_raw(p, R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4);
  auto e = error_of([&] { TensorStore().add_file(p); });
  EXPECT_NE(e.find("F8_E4M3"), std::string::npos);
  EXPECT_NE(e.find("supported: F32, F16, BF16"), std::string::npos);
}

TEST(Safetensors, GarbageHeader) {
  const std::string p = tmpdir() + "/garbage.safetensors";
  write_raw(p, "{not json", 0);
  EXPECT_NE(error_of([&] { TensorStore().add_file(p); }).find("not valid JSON"), std::string::npos);
}

TEST(Config, BothRopeStyles) {
  auto t4 = parse_hf_config(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":1,"num_attention_heads":2,"rope_theta":500000.0,
    "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
    "original_max_position_embeddings":8192}})", "t4");
  EXPECT_EQ(t4.rope.theta, 500000.0);
  EXPECT_EQ(t4.rope.type, RopeConfig::Type::Llama3);
  auto t5 = parse_hf_config(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":1,"num_attention_heads":2,
    "rope_parameters":{"rope_theta":1234.0,"rope_type":"linear","factor":2.0}})", "t5");
  EXPECT_EQ(t5.rope.theta, 1234.0);
  EXPECT_EQ(t5.rope.type, RopeConfig::Type::Linear);
  EXPECT_EQ(t5.rope.factor, 2.0);
  EXPECT_EQ(t5.n_kv_heads, 2);
}

TEST(Config, UnsupportedArchitectureAndRope) {
  auto e = error_of([] { parse_hf_config(R"({"model_type":"gpt2"})", "c.json"); });
  EXPECT_NE(e.find("supported: llama, mistral, qwen2"), std::string::npos) << e;
  e = error_of([] {
    parse_hf_config(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
      "num_hidden_layers":1,"num_attention_heads":2,"rope_scaling":{"type":"yarn","factor":4}})", "c.json");
  });
  EXPECT_NE(e.find("supported: default, linear, llama3"), std::string::npos) << e;
  e = error_of([] { parse_hf_config(R"({"model_type":"llama","vocab_size":10})", "c.json"); });
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
}

// A model folder whose safetensors lacks a tensor / has a wrong shape.
TEST(ModelLoad, MissingTensorAndWrongShape) {
  const std::string src = test::fixture("hf/llama-gqa-tied");
  const std::string d = tmpdir() + "/model";
  fs::create_directories(d);
  fs::copy_file(src + "/config.json", d + "/config.json", fs::copy_options::overwrite_existing);
  TensorStore s;
  s.add_file(src + "/model.safetensors");
  std::vector<TensorToWrite> all;
  for (auto& [name, t] : s.all())
    if (name != "model.norm.weight") all.push_back({name, t.dtype, t.shape, t.data});
  write_safetensors(d + "/model.safetensors", all);
  auto e = error_of([&] { Model::load_hf(d); });
  EXPECT_NE(e.find("missing tensor model.norm.weight"), std::string::npos) << e;
  std::vector<float> wrong(63, 1.f);
  all.push_back({"model.norm.weight", DType::F32, {63}, wrong.data()});
  write_safetensors(d + "/model.safetensors", all);
  e = error_of([&] { Model::load_hf(d); });
  EXPECT_NE(e.find("has shape [63], expected [64]"), std::string::npos) << e;
}

TEST(ModelLoad, FolderWithoutConfig) {
  const std::string d = tmpdir() + "/empty";
  fs::create_directories(d);
  EXPECT_NE(error_of([&] { Model::load_hf(d); }).find("no config.json"), std::string::npos);
  EXPECT_NE(error_of([&] { Model::load_hf(d + "/nope"); }).find("no such file"), std::string::npos);
}

TEST(ModelLoad, Bf16StaysMapped) {
  // flagship-27m is bf16: the loaded weights are views into the mapped files,
  // not fp32 copies (a bf16 model must not double in RAM).
  auto m = Model::load_hf(test::repo_dir() + "/models/flagship-27m");
  EXPECT_EQ(m->tensors().get("model.layers.0.mlp.up_proj.weight").dtype, DType::BF16);
  EXPECT_LE(m->weight_bytes(), m->tensors().mapped_bytes());
}

// FileLoad::Read gives the file's bytes as Map does, for sizes either side of
// a 2 MiB huge page (the read buffer is rounded up to it) and for an empty file.
TEST(MappedFile, ReadEqualsMap) {
  for (size_t n : {size_t(0), size_t(1), size_t(4095), (size_t(2) << 20) - 3, (size_t(2) << 20) + 17}) {
    const std::string p = tmpdir() + "/bytes" + std::to_string(n);
    std::string bytes(n, '\0');
    for (size_t i = 0; i < n; ++i) bytes[i] = char((i * 131 + 7) % 251);
    { std::ofstream f(p, std::ios::binary); f << bytes; }
    MappedFile mapped(p, FileLoad::Map), read(p, FileLoad::Read);
    ASSERT_EQ(read.size(), n);
    ASSERT_EQ(mapped.size(), n);
    if (n) {
      EXPECT_EQ(std::memcmp(read.data(), bytes.data(), n), 0) << n;
      EXPECT_EQ(std::memcmp(mapped.data(), bytes.data(), n), 0) << n;
      EXPECT_NE(read.data(), mapped.data());
    }
    MappedFile moved = std::move(read);  // the buffer moves with it, and is unmapped once
    if (n) {
      EXPECT_EQ(std::memcmp(moved.data(), bytes.data(), n), 0);
    }
  }
  EXPECT_NE(error_of([&] { MappedFile(tmpdir() + "/absent", FileLoad::Read); }).find("cannot open"), std::string::npos);
}

// rewrite(): a read-in file's bytes can be rewritten in place (the range
// only, the file on disk untouched, the object moved keeps them); a mapped
// file and ranges outside the file refuse without running the function.
TEST(MappedFile, RewriteChangesOnlyAReadInCopy) {
  const size_t n = (size_t(2) << 20) + 4099;  // across a huge page
  const std::string p = tmpdir() + "/rewrite";
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = char((i * 37 + 3) % 253);
  { std::ofstream f(p, std::ios::binary); f << bytes; }
  MappedFile read(p, FileLoad::Read), mapped(p, FileLoad::Map);
  const size_t off = (size_t(2) << 20) - 10, len = 20;  // straddles the huge-page boundary
  bool ran = false;
  EXPECT_TRUE(read.rewrite(read.data() + off, len, [&](std::byte* q) {
    ran = true;
    for (size_t i = 0; i < len; ++i) q[i] = std::byte(0xAB);
  }));
  EXPECT_TRUE(ran);
  for (size_t i = 0; i < n; ++i) {
    const char want = i >= off && i < off + len ? char(0xAB) : bytes[i];
    ASSERT_EQ(char(read.data()[i]), want) << i;
  }
  EXPECT_EQ(std::memcmp(mapped.data(), bytes.data(), n), 0);  // the file itself is as it was
  ran = false;
  const auto mark = [&](std::byte*) { ran = true; };
  EXPECT_FALSE(mapped.rewrite(mapped.data(), 4, mark));
  EXPECT_FALSE(read.rewrite(read.data() + n - 2, 4, mark));  // past the end
  EXPECT_FALSE(read.rewrite(mapped.data(), 4, mark));        // not this file's bytes
  EXPECT_FALSE(ran);
  MappedFile moved = std::move(read);
  EXPECT_TRUE(moved.rewrite(moved.data(), 1, [](std::byte* q) { q[0] = std::byte(1); }));
  EXPECT_EQ(moved.data()[0], std::byte(1));
}

// A model read into memory holds the same weights as the mapped one.
TEST(ModelLoad, ReadAndMapGiveTheSameWeights) {
  auto a = Model::load_hf(test::repo_dir() + "/models/flagship-27m", FileLoad::Map);
  auto b = Model::load_hf(test::repo_dir() + "/models/flagship-27m", FileLoad::Read);
  const TensorView& ta = a->tensors().get("model.layers.3.mlp.down_proj.weight");
  const TensorView& tb = b->tensors().get("model.layers.3.mlp.down_proj.weight");
  ASSERT_EQ(ta.shape, tb.shape);
  EXPECT_NE(ta.data, tb.data);
  EXPECT_EQ(std::memcmp(ta.data, tb.data, ta.nbytes()), 0);
}

}  // namespace
}  // namespace ptllm
