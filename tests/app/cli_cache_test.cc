// The cache flags end to end through the posttrainllm binary: bad input is
// one line naming the flag and a non-zero exit; a bounded cache lets sample
// go past the model context; cache-table prints the measured bytes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ptllm {
namespace {

using Result = test::CliResult;
Result run(const std::string& args) { return test::run_cli(args); }

const std::string kStories = test::repo_dir() + "/models/stories260K";

void expect_error(const std::string& flags, const std::string& needle) {
  Result r = run("sample " + kStories + " -p hi -n 2 " + flags + " 2>&1");
  EXPECT_NE(r.status, 0) << flags;
  EXPECT_LT(r.status, 128) << "crashed: " << flags;
  EXPECT_NE(r.out.find(needle), std::string::npos) << flags << "\n" << r.out;
}

TEST(CacheFlags, BadInputIsAnErrorNamingTheFlag) {
  expect_error("--kv-quantize int5", "--kv-quantize: got int5, expected one of fp32, fp16, bf16, int8, int4, int3");
  expect_error("--streaming-llm-sink -1 --streaming-llm-window 8", "--streaming-llm-sink: got -1");
  expect_error("--streaming-llm-window -2", "--streaming-llm-window: got -2");
  // Window 0 means unbounded in every command (README), so sinks need a window >= 1.
  expect_error("--streaming-llm-sink 4", "--streaming-llm-sink 4: expected 0 when --streaming-llm-window is 0");
  expect_error("--streaming-llm-sink 4 --streaming-llm-window 0",
               "--streaming-llm-sink 4: expected 0 when --streaming-llm-window is 0");
  expect_error("--streaming-llm-window x", "--streaming-llm-window: got x, expected an integer >= 0 (0 = unbounded)");
  expect_error("--streaming-llm-rope relative", "--streaming-llm-rope: got relative");
  // Grouped KIVI, int2 and asymmetric K/V flags.
  expect_error("--kv-quantize INT2", "--kv-quantize: got INT2, expected one of fp32, fp16, bf16, int8, int4, int3, int2");
  expect_error("--kv-quantize-k int5", "--kv-quantize-k: got int5, expected one of");
  expect_error("--kv-rotate quarot", "--kv-rotate: got quarot, expected none or hadamard");
  expect_error("--kivi-k-axis row", "--kivi-k-axis: got row, expected channel or token");
  expect_error("--kivi-residual-dtype int8", "--kivi-residual-dtype: got int8, expected one of fp32, fp16, bf16");
  expect_error("--kv-quantize-v 2bit", "--kv-quantize-v: got 2bit, expected one of");
  expect_error("--kivi-group -1", "--kivi-group: got -1");
  expect_error("--kivi-residual -8", "--kivi-residual: got -8");
  expect_error("--kv-quantize int4 --kivi-group 32 --kivi-residual 100",
               "--kivi-residual 100: expected a multiple of --kivi-group 32");
}

// --streaming-llm-window 0 is the unbounded cache, as in the sweeps of perplexity/compare.
TEST(CacheFlags, WindowZeroIsUnbounded) {
  Result r = run("sample " + kStories + " -p hi -n 2 --seed 1 --threads 1 --json --streaming-llm-window 0 2>/dev/null");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto kv = nlohmann::json::parse(r.out)["stats"]["kv_cache"];
  EXPECT_EQ(kv["window"], 0);
  EXPECT_EQ(kv["bounded"], false);
  EXPECT_TRUE(kv["rope"].is_null());
}

// stories260K has a 512-token context: unbounded stops there with a note,
// a StreamingLLM cache goes on, never storing more than sink + window.
TEST(CacheFlags, BoundedCacheGeneratesPastTheContext) {
  Result unb = run("sample " + kStories + " -p 'Once upon a time' -n 700 --ignore-eos --seed 1 --threads 1 2>&1 >/dev/null");
  ASSERT_EQ(unb.status, 0) << unb.out;
  EXPECT_NE(unb.out.find("stopped at the model's context length"), std::string::npos) << unb.out;
  for (const char* q : {"fp32", "int4"}) {
    Result r = run("sample " + kStories + " -p 'Once upon a time' -n 700 --ignore-eos --seed 1 --threads 1 --json " +
                   "--kv-quantize " + q + " --streaming-llm-sink 4 --streaming-llm-window 60 2>/dev/null");
    ASSERT_EQ(r.status, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["generated_ids"].size(), 700u);
    EXPECT_EQ(j["stats"]["stop_reason"], "length");
    EXPECT_EQ(j["stats"]["stored_tokens"], 64);
    EXPECT_GT(j["stats"]["position"].get<int64_t>(), 512);
    for (auto& s : j["stats"]["stored_tokens_per_layer"]) EXPECT_LE(s.get<int64_t>(), 64);
    EXPECT_GT(j["stats"]["kv_cache_payload_bytes"].get<int64_t>(), 0);
    // The settings as the one cache JSON object (kv/cache_spec.h), every field.
    const auto& kv = j["stats"]["kv_cache"];
    EXPECT_EQ(kv["quantize"], q);
    EXPECT_EQ(kv["sink"], 4);
    EXPECT_EQ(kv["window"], 60);
    EXPECT_EQ(kv["rope"], "reposition");
    EXPECT_EQ(kv["bounded"], true);
    EXPECT_TRUE(kv.contains("kivi_group") && kv.contains("quantize_k") && kv.contains("label")) << kv;
  }
}

TEST(CacheFlags, CacheTablePrintsMeasuredBytes) {
  Result r = run("cache-table --lengths 500 --json 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  auto row = j["rows"][0];
  EXPECT_EQ(row["tokens"], 500);
  EXPECT_EQ(row["fp32"]["total"], 12288000);
  EXPECT_EQ(row["bf16"]["total"], 6144000);
  // cache-table uses the default options: grouped KIVI (G 32, R 128, fp16
  // residual), so at T = 500 the newest 148 tokens are fp16 and 352 quantised
  // (formula in docs/CACHE.md; issue 4's simple-scheme numbers are checked with
  // --kivi-group 0 in CacheBytes.MatchFormulaAndIssueNumbers).
  EXPECT_EQ(row["int8"]["payload"], 3981312);
  EXPECT_EQ(row["int4"]["payload"], 2899968);
  EXPECT_EQ(row["int4"]["scales"], 270336);
  EXPECT_EQ(row["int3"]["payload"], 2629632);
  EXPECT_EQ(row["int2"]["payload"], 2359296);
  Result bad = run("cache-table --lengths 0,5 2>&1");
  EXPECT_NE(bad.status, 0);
}

}  // namespace
}  // namespace ptllm
