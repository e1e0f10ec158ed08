// The CLI end to end: bad input gives one line naming the problem and a
// non-zero exit; good input produces text.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "test_util.h"

namespace ptllm {
namespace {

using Result = test::CliResult;

// Runs the CLI; stderr is merged into the captured output unless stdout_only.
Result run(const std::string& args, bool stdout_only = false) {
  return test::run_cli(args + (stdout_only ? " 2>/dev/null" : " 2>&1"));
}

const std::string kStories = test::repo_dir() + "/models/stories260K";

void expect_error(const std::string& args, const std::string& needle) {
  Result r = run(args);
  EXPECT_NE(r.status, 0) << args;
  EXPECT_LT(r.status, 128) << "crashed: " << args;  // not a signal
  EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
  EXPECT_EQ(r.out.find("nan"), std::string::npos) << r.out;
}

TEST(Cli, SampleGreedyStories) {
  Result r = run("sample " + kStories + " --prompt 'Once upon a time' --tokens 20 --temperature 0");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("there was a little girl named Lily"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode"), std::string::npos);
}

TEST(Cli, SampleJsonHasDocumentedKeys) {
  Result r = run("sample " + kStories + " --prompt 'Once upon a time' --tokens 5 --seed 3 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"prompt_ids", "generated_ids", "text", "stats"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["generated_ids"].size(), 5u);
  EXPECT_EQ(j["stats"]["generated_tokens"], 5);
}

TEST(Cli, SameSeedSameText) {
  const std::string a = "sample " + kStories + " --prompt 'Once upon a time' --tokens 30 --temperature 1 --seed 7 --json";
  Result r1 = run(a, true), r2 = run(a, true);
  ASSERT_EQ(r1.status, 0);
  EXPECT_EQ(nlohmann::json::parse(r1.out)["generated_ids"], nlohmann::json::parse(r2.out)["generated_ids"]);
}

TEST(Cli, StopsAtContextWithNote) {
  Result r = run("sample " + kStories + " --prompt 'Once upon a time' --tokens 600 --temperature 0 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("context length (512 tokens)"), std::string::npos) << r.out;
}

TEST(Cli, BadInputs) {
  expect_error("sample /nonexistent/model --prompt hi", "/nonexistent/model: no such file or folder");
  expect_error("sample /tmp --prompt hi", "no config.json");
  expect_error("sample " + kStories + " --prompt hi --tokens -1", "--tokens -1");
  expect_error("sample " + kStories + " --prompt hi --temperature -1", "--temperature");
  expect_error("sample " + kStories + " --prompt hi --top-p 0", "--top-p");
  expect_error("sample " + kStories + " --prompt hi --top-p 1.5", "--top-p");
  expect_error("sample " + kStories + " --prompt hi --frobnicate", "frobnicate");
  expect_error("sample " + kStories + " --prompt hi --tokens many", "--tokens");
  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += "the cat ";
  expect_error("sample " + kStories + " --prompt '" + long_prompt + "'", "longer than the model's context of 512");
  expect_error("logits " + kStories + " --ids 1,2,99999 --out /tmp/x.safetensors", "outside the vocabulary");
}

TEST(Cli, HelpOnEveryCommand) {
  for (const char* c : {"sample", "logits", "tokenize"}) {
    Result r = run(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c;
  }
}

// Every command that runs a model takes the device flags, --device-batch-invariant included
// (the GPU engine's batch-invariant mode: docs/CUDA.md). On the CPU, always batch-invariant,
// the flag changes nothing; asking for the GPU without one is a one-line error either way.
TEST(Cli, DeviceFlagsOnEveryModelCommand) {
  for (const char* c : {"sample", "perplexity", "bench", "serve"}) {
    Result r = run(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c;
    for (const char* flag : {"--device", "--device-weights", "--device-batch-invariant"})
      EXPECT_NE(r.out.find(flag), std::string::npos) << c << " " << flag << "\n" << r.out;
  }
  const std::string a = "sample " + kStories + " --prompt 'Once upon a time' --tokens 12 --temperature 0 --json";
  Result plain = run(a, true), flagged = run(a + " --device-batch-invariant", true);
  ASSERT_EQ(plain.status, 0) << plain.out;
  ASSERT_EQ(flagged.status, 0) << flagged.out;
  EXPECT_EQ(nlohmann::json::parse(plain.out)["generated_ids"], nlohmann::json::parse(flagged.out)["generated_ids"]);
  if (std::system("nvidia-smi -L >/dev/null 2>&1") != 0)
    expect_error("sample " + kStories + " --prompt hi --device cuda --device-batch-invariant", "--device cuda");
}

// The evaluation commands take the KIVI flags; the sweep commands document how lists combine.
TEST(Cli, EvalCommandsListKiviFlagsInHelp) {
  for (const char* c : {"perplexity", "compare", "cache-table"}) {
    Result r = run(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c;
    for (const char* flag : {"--kv-quantize-k", "--kv-quantize-v", "--kivi-group", "--kivi-residual"})
      EXPECT_NE(r.out.find(flag), std::string::npos) << c << " " << flag << "\n" << r.out;
  }
  for (const char* c : {"perplexity", "compare"}) {
    Result r = run(std::string(c) + " --help");
    EXPECT_NE(r.out.find("Pairs are zipped"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--kivi-group with --kivi-residual"), std::string::npos) << r.out;
  }
}

uint64_t int4_total(const nlohmann::json& j, const char* column = "int4") {
  return j["rows"][0][column]["total"].get<uint64_t>();
}

// cache-table: the simple scheme (--kivi-group 0) holds fewer bytes than the
// grouped default (whose newest 128+ tokens stay fp32); K/V overrides give
// one column per distinct cache; bad values name the flag.
TEST(Cli, CacheTableKiviFlags) {
  Result grouped = run("cache-table " + kStories + " --lengths 256 --json", true);
  Result simple = run("cache-table " + kStories + " --lengths 256 --kivi-group 0 --json", true);
  Result small_residual = run("cache-table " + kStories + " --lengths 256 --kivi-group 16 --kivi-residual 32 --json", true);
  ASSERT_EQ(grouped.status, 0) << grouped.out;
  ASSERT_EQ(simple.status, 0) << simple.out;
  ASSERT_EQ(small_residual.status, 0) << small_residual.out;
  const auto jg = nlohmann::json::parse(grouped.out), js = nlohmann::json::parse(simple.out),
             jr = nlohmann::json::parse(small_residual.out);
  // Each column's settings as the one cache JSON object.
  const auto int4_column = [](const nlohmann::json& j) {
    for (const auto& c : j["columns"])
      if (c["label"].get<std::string>().rfind("int4", 0) == 0) return c;
    return nlohmann::json();
  };
  EXPECT_EQ(int4_column(jg)["kivi_group"], 32);
  EXPECT_EQ(int4_column(js)["kivi_group"], 0);
  EXPECT_TRUE(int4_column(js)["kivi_residual"].is_null());
  EXPECT_TRUE(int4_column(js).contains("window"));
  EXPECT_LT(int4_total(js), int4_total(jg));
  EXPECT_LT(int4_total(jr), int4_total(jg));
  EXPECT_EQ(js["rows"][0]["fp32"], jg["rows"][0]["fp32"]);  // unquantised columns do not change
  Result kv = run("cache-table " + kStories + " --lengths 256 --kv-quantize-k int4 --kv-quantize-v int2 --json", true);
  ASSERT_EQ(kv.status, 0) << kv.out;
  const auto jkv = nlohmann::json::parse(kv.out);
  EXPECT_EQ(jkv["rows"][0].size(), 2u) << kv.out;  // "tokens" and the single cache
  EXPECT_TRUE(jkv["rows"][0].contains("K int4 / V int2")) << kv.out;
  Result text = run("cache-table " + kStories + " --lengths 256 --kivi-group 0");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("simple scheme"), std::string::npos) << text.out;
  expect_error("cache-table " + kStories + " --kivi-group 3 --kivi-residual 128",
               "--kivi-residual 128: expected a multiple of --kivi-group 3");
  expect_error("cache-table " + kStories + " --kv-quantize-k int5", "--kv-quantize-k");
  expect_error("cache-table " + kStories + " --kv-quantize-k int5", "int5");
  expect_error("cache-table " + kStories + " --kivi-group -1", "--kivi-group");
}

// cache-table's planner: a budget that fits some settings lists them (each
// within the budget); a bad budget or --length without --budget is one line naming the flag.
TEST(Cli, CacheTablePlanner) {
  // stories260K at 300 tokens: fp32 needs 384,000 bytes, the KIVI settings less.
  Result r = run("cache-table " + kStories + " --budget 200KiB --length 300 --json", true);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["budget_bytes"], 204800);
  ASSERT_FALSE(j["fits"].empty()) << r.out;
  for (const auto& f : j["fits"]) {
    EXPECT_LE(f["bytes"].get<uint64_t>(), 204800u);
    EXPECT_NE(f["kv_cache"]["label"], "fp32");
    EXPECT_TRUE(f["quality"].is_null());
  }
  Result none = run("cache-table " + kStories + " --budget 10 --length 300");
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_NE(none.out.find("nothing fits"), std::string::npos) << none.out;
  expect_error("cache-table " + kStories + " --budget 64XB --length 300", "--budget 64XB: expected a byte count");
  expect_error("cache-table " + kStories + " --budget 200KiB", "--length 0: expected a token count >= 1");
  expect_error("cache-table " + kStories + " --length 300", "--length / --quality: expected with --budget");
}

TEST(Cli, WeightsFlag) {
  // A bad --weights is one line naming the flag and the value, on every
  // command that loads a model through load_model_opts.
  const std::string text = test::repo_dir() + "/README.md";
  for (const std::string& args : {"sample " + kStories + " --prompt hi", "bench " + kStories + " -p 4 -n 2 -r 1",
                                  "logits " + kStories + " --ids 1 --out /tmp/ptllm_never.safetensors",
                                  "perplexity " + kStories + " " + text}) {
    Result r = run(args + " --weights q9_9");
    EXPECT_NE(r.status, 0) << args;
    EXPECT_EQ(r.out.find("error: --weights \"q9_9\": expected one of f32, f16, bf16, q8_0"), 0u) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
  }
  Result r = run("sample " + kStories + " --weights q8_0 --prompt 'Once upon a time' --tokens 8 --temperature 0");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string out = std::filesystem::temp_directory_path() / "ptllm_cli_logits_q4k.safetensors";
  r = run("logits " + kStories + " --weights q4_k --ids 1,403,407 --out " + out);
  ASSERT_EQ(r.status, 0) << r.out;
}

TEST(Cli, LogitsWritesSafetensors) {
  const std::string out = std::filesystem::temp_directory_path() / "ptllm_cli_logits.safetensors";
  Result r = run("logits " + kStories + " --ids 1,403,407 --out " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_GT(std::filesystem::file_size(out), 3u * 512 * 4);
}

}  // namespace
}  // namespace ptllm
