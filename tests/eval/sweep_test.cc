// expand_sweep: how the cache flags' comma lists become settings (pairing,
// crossing, canonical duplicates, errors naming the flag's field).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "eval/report.h"
#include "eval/sweep.h"
#include "test_util.h"

namespace ptllm {
namespace {

TEST(Sweep, PairsSinkWithWindowAndCrossesStorageAndRope) {
  eval::SweepFlags f;
  f.kv_quantize = "fp32, int8";
  f.sink = "0,0,4";
  f.window = "0,256,252";
  f.rope = "absolute,reposition";
  auto s = eval::expand_sweep(f);
  // (0,0) unbounded: RoPE mode is irrelevant, so 2 storages; (0,256) and (4,252): 2 ropes x 2 storages each.
  ASSERT_EQ(s.size(), 2u + 4u + 4u);
  EXPECT_EQ(s[0].window, 0);
  EXPECT_EQ(s[1].storage, KVStorage::Int8);
  EXPECT_EQ(s[2].window, 256);
  EXPECT_EQ(s[2].rope_mode, RopeMode::Absolute);
  EXPECT_EQ(s[9].sink, 4);
  EXPECT_EQ(s[9].rope_mode, RopeMode::Reposition);
  EXPECT_EQ(s[9].label(), "int8 · sink 4 + window 252 · reposition");
  EXPECT_EQ(eval::expand_sweep({}).size(), 1u);  // the plain fp32 cache
  f.window = "0,256";
  EXPECT_THROW(eval::expand_sweep(f), Error);  // 3 sinks, 2 windows
  EXPECT_THROW(eval::expand_sweep({.kv_quantize = "int9"}), Error);
  EXPECT_THROW(eval::expand_sweep({.sink = "x"}), Error);
  EXPECT_THROW(eval::expand_sweep({.sink = "4"}), Error);  // a sink without a window bounds nothing
}

// --kivi-group 0,32: two settings (the simple and the grouped scheme) with
// distinct labels; the KIVI part is shown on every quantised setting of the sweep.
TEST(Sweep, KiviGroupListGivesDistinctSettings) {
  eval::SweepFlags f;
  f.kv_quantize = "int4";
  f.kivi_group = "0,32";
  auto s = eval::expand_sweep(f);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].storage, KVStorage::Int4);
  EXPECT_EQ(s[1].storage, KVStorage::Int4);
  EXPECT_EQ(s[0].kivi_group, 0);
  EXPECT_EQ(s[1].kivi_group, 32);
  EXPECT_EQ(s[1].kivi_residual, 128);
  EXPECT_FALSE(s[0].grouped());
  EXPECT_TRUE(s[1].grouped());
  const auto labels = spec_labels(s);
  ASSERT_EQ(labels.size(), 2u);
  EXPECT_EQ(labels[0], "int4 simple");
  EXPECT_EQ(labels[1], "int4 G32 R128");
  EXPECT_NE(s[0].label(), s[1].label());  // distinct even without the sweep context
  EXPECT_EQ(s[1].label(), "int4");                   // defaults alone: the old label
  // The residual is paired with the group, a single value repeated.
  f.kivi_group = "16,32";
  f.kivi_residual = "64,128";
  s = eval::expand_sweep(f);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].kivi_group, 16);
  EXPECT_EQ(s[0].kivi_residual, 64);
  EXPECT_EQ(s[1].kivi_group, 32);
  EXPECT_EQ(s[1].kivi_residual, 128);
  EXPECT_EQ(spec_labels(s)[0], "int4 G16 R64");
  f.kivi_residual = "128";
  EXPECT_EQ(eval::expand_sweep(f).size(), 2u);
  f.kivi_residual = "64,128,256";
  EXPECT_THROW(eval::expand_sweep(f), Error);  // 2 groups, 3 residuals
}

TEST(Sweep, KiviValuesOnlyMatterForQuantisedCaches) {
  eval::SweepFlags f;
  f.kv_quantize = "fp32,int4";
  f.kivi_group = "0,32";
  auto s = eval::expand_sweep(f);
  // fp32 ignores the group: once; int4 twice. Order: group outside storage.
  ASSERT_EQ(s.size(), 3u);
  const auto labels = spec_labels(s);
  EXPECT_EQ(labels, (std::vector<std::string>{"fp32", "int4 simple", "int4 G32 R128"}));
  EXPECT_EQ(s[0].kivi_group, 32);  // reset to the default where it does not apply
  // The residual does not matter to the simple scheme.
  f.kv_quantize = "int8";
  f.kivi_group = "0,0";
  f.kivi_residual = "64,128";
  EXPECT_EQ(eval::expand_sweep(f).size(), 1u);
}

TEST(Sweep, KeyValueStoragesArePairedAndOverrideKvQuantize) {
  eval::SweepFlags f;
  f.kv_quantize_k = "int4,int8";
  f.kv_quantize_v = "int2";
  auto s = eval::expand_sweep(f);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].k_storage(), KVStorage::Int4);
  EXPECT_EQ(s[0].v_storage(), KVStorage::Int2);
  EXPECT_EQ(s[1].k_storage(), KVStorage::Int8);
  EXPECT_EQ(s[1].v_storage(), KVStorage::Int2);
  EXPECT_EQ(s[0].label(), "K int4 / V int2");
  EXPECT_EQ(spec_labels(s)[1], "K int8 / V int2");
  // Both halves given: --kv-quantize makes no difference, one setting per pair.
  f.kv_quantize = "fp32,int4";
  EXPECT_EQ(eval::expand_sweep(f).size(), 2u);
  // Only K given: V follows each --kv-quantize entry; K int4 + V int4 is plain "int4".
  f.kv_quantize_k = "int4";
  f.kv_quantize_v = "";
  s = eval::expand_sweep(f);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].label(), "K int4 / V fp32");
  EXPECT_EQ(s[1].label(), "int4");
  f.kivi_group = "0";
  EXPECT_EQ(spec_labels(eval::expand_sweep(f))[0], "K int4 / V fp32 simple");
  f.kv_quantize_k = "int4,int8,int2";
  f.kv_quantize_v = "int2,int4";
  EXPECT_THROW(eval::expand_sweep(f), Error);  // 3 keys, 2 values
}

// The error as the CLI prints it (app/cache_flags.cc maps fields to flags the same way).
std::string sweep_error(const eval::SweepFlags& f) {
  const std::map<std::string, std::string> flag = {
      {"quantize", "--kv-quantize"},        {"quantize_k", "--kv-quantize-k"},     {"quantize_v", "--kv-quantize-v"},
      {"sink", "--streaming-llm-sink"},     {"window", "--streaming-llm-window"}, {"rope", "--streaming-llm-rope"},
      {"kivi_group", "--kivi-group"},       {"kivi_residual", "--kivi-residual"}, {"rotate", "--kv-rotate"},
      {"k_axis", "--kivi-k-axis"},          {"residual_dtype", "--kivi-residual-dtype"}};
  try {
    eval::expand_sweep(f);
  } catch (const CacheSpecError& e) {
    return e.issue().message([&](std::string_view field) { return flag.at(std::string(field)); });
  }
  return "(no error)";
}

TEST(Sweep, BadKiviValuesNameTheFlag) {
  eval::SweepFlags f;
  f.kv_quantize = "int4";
  f.kivi_group = "3";
  f.kivi_residual = "128";
  EXPECT_EQ(sweep_error(f), "--kivi-residual 128: expected a multiple of --kivi-group 3");
  f.kv_quantize = "fp32";  // the values are wrong whatever the storage
  EXPECT_EQ(sweep_error(f), "--kivi-residual 128: expected a multiple of --kivi-group 3");
  f = {};
  f.kv_quantize_k = "int5";
  EXPECT_EQ(sweep_error(f), "--kv-quantize-k int5: expected one of fp32, fp16, bf16, int8, int4, int3, int2");
  f = {};
  f.kv_quantize_v = "int4,";
  EXPECT_NE(sweep_error(f).find("--kv-quantize-v \"int4,\": expected no empty entry"), std::string::npos) << sweep_error(f);
  f = {};
  f.kivi_group = "32,x";
  EXPECT_NE(sweep_error(f).find("--kivi-group \"32,x\": expected a comma-separated list of integers >= 0"),
            std::string::npos);
  f = {};
  f.kivi_residual = "-1";
  EXPECT_NE(sweep_error(f).find("--kivi-residual"), std::string::npos);
  f = {};
  f.kivi_group = "16,32,64";
  f.kivi_residual = "64,128";
  EXPECT_NE(sweep_error(f).find("--kivi-group has 3 values: expected as many as --kivi-residual (2)"), std::string::npos)
      << sweep_error(f);
}

TEST(Sweep, SettingJsonHasKiviFields) {
  eval::SweepFlags f;
  f.kv_quantize = "fp32,int4";
  f.kv_quantize_v = "int2";
  f.kivi_group = "0,32";
  auto s = eval::expand_sweep(f);
  // Group 0: K fp32 / V int2 and K int4 / V int2, simple; group 32: the same two, grouped (V int2 is quantised).
  ASSERT_EQ(s.size(), 4u);
  const auto j0 = s[0].to_json();
  EXPECT_EQ(j0["quantize_k"], "fp32");
  EXPECT_EQ(j0["quantize_v"], "int2");
  EXPECT_EQ(j0["kivi_group"], 0);
  EXPECT_TRUE(j0["kivi_residual"].is_null());  // no residual in the simple scheme
  const auto j2 = s.back().to_json();
  EXPECT_EQ(j2["kivi_group"], 32);
  EXPECT_EQ(j2["kivi_residual"], 128);
  EXPECT_TRUE(j2["rope"].is_null());  // unbounded: RoPE mode does not apply
  EXPECT_TRUE(CacheSpec{}.to_json()["kivi_group"].is_null());
}

// The crossed text fields: rotation and K axis apply to every storage, settings
// that build the same cache run once, and a bad entry names its field.
TEST(Sweep, RotationAndKeyAxisAreCrossedAndCanonical) {
  eval::SweepFlags f;
  f.kv_quantize = "int4,fp32";
  f.rotate = "none,hadamard";
  f.k_axis = "channel,token";
  const auto s = eval::expand_sweep(f);
  // fp32 has no K axis (canonical: per-token fp32 is plain fp32), so 4 int4 + 2 fp32.
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(spec_labels(s), (std::vector<std::string>{"int4", "fp32", "int4 K per-token", "int4 hadamard",
                                                      "fp32 hadamard", "int4 K per-token hadamard"}));
  EXPECT_EQ(s[3].rotate, KVRotate::Hadamard);
  EXPECT_EQ(s[2].k_axis, KeyAxis::Token);
  f.residual_dtype = "fp32,fp16";
  f.rotate = "";
  f.k_axis = "";
  f.kv_quantize = "int8";
  const auto r = eval::expand_sweep(f);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].residual_dtype, KVStorage::F32);
  EXPECT_EQ(r[1].residual_dtype, KVStorage::F16);
  f.rotate = "none,spin";
  EXPECT_NE(sweep_error(f).find("--kv-rotate"), std::string::npos) << sweep_error(f);
  f.rotate = "";
  f.k_axis = "channel,";
  EXPECT_NE(sweep_error(f).find("--kivi-k-axis"), std::string::npos) << sweep_error(f);
}

}  // namespace
}  // namespace ptllm
