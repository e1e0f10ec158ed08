// CacheSpec (kv/cache_spec.h): the one owner of the cache settings. Parsing
// a field, the structured issue (field, value, expected), canonical form and
// ==, labels, and the JSON object (to_json / from_json) the commands print and
// the server accepts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kv/cache_spec.h"
#include "test_util.h"

namespace ptllm {
namespace {

CacheSpec spec(KVStorage s, int64_t sink = 0, int64_t window = 0, RopeMode r = RopeMode::Reposition,
               int64_t group = CacheSpec{}.kivi_group, int64_t residual = CacheSpec{}.kivi_residual) {
  return test::cache_spec(s, sink, window, r, group, residual);
}

void expect_issue(const CacheSpec& o, const std::string& field, const std::string& value, const std::string& needle) {
  const auto i = o.issue();
  ASSERT_TRUE(i.has_value()) << "no issue, expected one for " << field;
  EXPECT_EQ(i->field, field);
  EXPECT_EQ(i->value, value);
  EXPECT_NE(i->expected.find(needle), std::string::npos) << i->expected;
  EXPECT_THROW(o.check(), CacheSpecError);
}

TEST(CacheSpec, SetParsesEveryField) {
  CacheSpec s;
  EXPECT_FALSE(s.set("quantize", "int4"));
  EXPECT_FALSE(s.set("quantize_k", "int8"));
  EXPECT_FALSE(s.set("quantize_v", "int2"));
  EXPECT_FALSE(s.set("sink", "4"));
  EXPECT_FALSE(s.set("window", "252"));
  EXPECT_FALSE(s.set("rope", "absolute"));
  EXPECT_FALSE(s.set("kivi_group", "16"));
  EXPECT_FALSE(s.set("kivi_residual", "64"));
  EXPECT_FALSE(s.set("residual_dtype", "bf16"));
  EXPECT_FALSE(s.set("rotate", "hadamard"));
  EXPECT_FALSE(s.set("k_axis", "token"));
  EXPECT_EQ(s.rotate, KVRotate::Hadamard);
  EXPECT_EQ(s.k_axis, KeyAxis::Token);
  EXPECT_EQ(s.storage, KVStorage::Int4);
  EXPECT_EQ(s.residual_dtype, KVStorage::BF16);
  EXPECT_EQ(s.k_storage(), KVStorage::Int8);
  EXPECT_EQ(s.v_storage(), KVStorage::Int2);
  EXPECT_EQ(s.sink, 4);
  EXPECT_EQ(s.window, 252);
  EXPECT_EQ(s.rope_mode, RopeMode::Absolute);
  EXPECT_EQ(s.kivi_group, 16);
  EXPECT_EQ(s.kivi_residual, 64);
  EXPECT_FALSE(s.issue());
}

TEST(CacheSpec, SetReportsFieldValueAndExpected) {
  CacheSpec s;
  const CacheSpec before = s;
  for (const char* bad : {"INT2", "i2", "2bit", "int 2", ""}) {
    auto i = s.set("quantize_v", bad);
    ASSERT_TRUE(i) << bad;
    EXPECT_EQ(i->field, "quantize_v");
    EXPECT_EQ(i->value, bad);
    EXPECT_EQ(i->expected, "one of fp32, fp16, bf16, int8, int4, int3, int2");
  }
  auto i = s.set("window", "-2");
  ASSERT_TRUE(i);
  EXPECT_EQ(i->expected, "an integer >= 0 (0 = unbounded)");
  EXPECT_TRUE(s.set("sink", "4x"));
  EXPECT_TRUE(s.set("rope", "relative"));
  i = s.set("residual_dtype", "int4");  // the residual is what stays unquantised
  ASSERT_TRUE(i);
  EXPECT_EQ(i->field, "residual_dtype");
  EXPECT_EQ(i->expected, "one of fp32, fp16, bf16");
  i = s.set("rotate", "quarot");
  ASSERT_TRUE(i);
  EXPECT_EQ(i->expected, "none or hadamard");
  i = s.set("k_axis", "row");
  ASSERT_TRUE(i);
  EXPECT_EQ(i->expected, "channel or token");
  i = s.set("windw", "3");
  ASSERT_TRUE(i);
  EXPECT_EQ(i->value, "(unknown field)");
  EXPECT_EQ(s, before);  // nothing set by a bad value
}

TEST(CacheSpec, CrossFieldRules) {
  expect_issue(spec(KVStorage::F32, -1, 10), "sink", "-1", ">= 0");
  expect_issue(spec(KVStorage::F32, 0, -3), "window", "-3", ">= 0");
  // Window 0 means unbounded everywhere, so sinks alone are no bound.
  expect_issue(spec(KVStorage::F32, 4, 0), "sink", "4", "0 when {other} is 0");
  expect_issue(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, 100), "kivi_residual", "100", "a multiple of");
  expect_issue(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, -1, 0), "kivi_group", "-1", ">= 0");
  expect_issue(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 5000, 5000), "kivi_group", "5000", "<= 4096");
  expect_issue(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, -32), "kivi_residual", "-32", ">= 0");
  EXPECT_FALSE(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0, 100).issue());  // simple scheme: R unused
  EXPECT_FALSE(spec(KVStorage::Int8, 0, 16).issue());  // a window without sinks: a plain sliding window
  EXPECT_FALSE(spec(KVStorage::F32).issue());          // window 0 = unbounded
}

TEST(CacheSpec, MessageNamesBothFields) {
  const auto i = spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, 100).issue();
  ASSERT_TRUE(i);
  EXPECT_EQ(i->message([](std::string_view f) { return "<" + std::string(f) + ">"; }),
            "<kivi_residual> 100: expected a multiple of <kivi_group> 32");
  try {
    spec(KVStorage::F32, 4, 0).check();
    ADD_FAILURE();
  } catch (const CacheSpecError& e) {
    EXPECT_EQ(std::string(e.what()),
              "kv_cache.sink 4: expected 0 when kv_cache.window is 0 (unbounded): the window sets the cache bound");
    EXPECT_EQ(e.issue().related, "window");
  }
}

TEST(CacheSpec, MakeCacheValidates) {
  KVCacheShape s;
  s.n_layers = 1;
  s.n_heads = s.n_kv_heads = 1;
  s.head_dim = 8;
  s.capacity = 16;
  EXPECT_THROW(make_cache(s, spec(KVStorage::F32, 4, 0)), CacheSpecError);
  EXPECT_THROW(make_cache(s, spec(KVStorage::Int4, 0, 8, RopeMode::Reposition, 32, 100)), CacheSpecError);
  auto c = make_cache(s, spec(KVStorage::Int4, 2, 6));
  EXPECT_TRUE(c->bounded());
}

TEST(CacheSpec, CanonicalMakesEqualCachesEqual) {
  // The RoPE mode of an unbounded cache, KIVI fields of an unquantised one and
  // the residual of the simple scheme make no difference.
  EXPECT_EQ(spec(KVStorage::F32, 0, 0, RopeMode::Absolute).canonical(), spec(KVStorage::F32).canonical());
  EXPECT_EQ(spec(KVStorage::BF16, 0, 0, RopeMode::Reposition, 0, 7).canonical(), spec(KVStorage::BF16).canonical());
  EXPECT_EQ(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0, 64).canonical(),
            spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0, 128).canonical());
  EXPECT_NE(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 16, 64).canonical(),
            spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 32, 64).canonical());
  EXPECT_NE(spec(KVStorage::F32, 0, 8, RopeMode::Absolute).canonical(), spec(KVStorage::F32, 0, 8).canonical());
  // K/V overrides: the same effective halves are one cache.
  CacheSpec a = spec(KVStorage::Int8), b = spec(KVStorage::F32);
  a.key_storage = KVStorage::Int4;
  a.value_storage = KVStorage::Int2;
  b.key_storage = KVStorage::Int4;
  b.value_storage = KVStorage::Int2;
  EXPECT_NE(a, b);
  EXPECT_EQ(a.canonical(), b.canonical());
  CacheSpec c = spec(KVStorage::Int4);
  c.key_storage = KVStorage::Int4;
  EXPECT_EQ(c.canonical(), spec(KVStorage::Int4).canonical());
  EXPECT_EQ(a.canonical().canonical(), a.canonical());
}

TEST(CacheSpec, LabelsAndDescription) {
  EXPECT_EQ(spec(KVStorage::Int8, 4, 252).label(), "int8 · sink 4 + window 252 · reposition");
  EXPECT_EQ(spec(KVStorage::F32, 0, 256, RopeMode::Absolute).label(), "fp32 · window 256 · absolute");
  EXPECT_EQ(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0).label(), "int4 simple");
  EXPECT_EQ(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 16, 64).label(), "int4 G16 R64");
  EXPECT_EQ(spec(KVStorage::Int4).label(), "int4");
  EXPECT_EQ(spec(KVStorage::Int4).label(true), "int4 G32 R128");
  CacheSpec kv = spec(KVStorage::F32);
  kv.key_storage = KVStorage::Int4;
  kv.value_storage = KVStorage::Int2;
  EXPECT_EQ(kv.storage_label(), "K int4 / V int2");
  const auto l = spec_labels({spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0), spec(KVStorage::Int4), spec(KVStorage::F32)});
  EXPECT_EQ(l, (std::vector<std::string>{"int4 simple", "int4 G32 R128", "fp32"}));
  EXPECT_NE(spec(KVStorage::Int8, 4, 252).describe().find("sink 4 + window 252"), std::string::npos);
  EXPECT_NE(kv.describe().find("K int4 per-channel"), std::string::npos) << kv.describe();
}

TEST(CacheSpec, JsonHasEveryFieldAndRoundTrips) {
  CacheSpec kv = spec(KVStorage::Int8, 4, 252, RopeMode::Absolute, 16, 64);
  kv.value_storage = KVStorage::Int2;
  const nlohmann::json j = kv.to_json();
  for (const char* f : {"quantize", "quantize_k", "quantize_v", "sink", "window", "rope", "kivi_group",
                        "kivi_residual", "residual_dtype", "rotate", "k_axis", "bounded", "label", "description"})
    EXPECT_TRUE(j.contains(f)) << f;
  EXPECT_EQ(j["residual_dtype"], "fp16");  // the default
  EXPECT_EQ(j["quantize"], "int8");
  EXPECT_EQ(j["quantize_k"], "int8");
  EXPECT_EQ(j["quantize_v"], "int2");
  EXPECT_EQ(j["sink"], 4);
  EXPECT_EQ(j["window"], 252);
  EXPECT_EQ(j["rope"], "absolute");
  EXPECT_EQ(j["kivi_group"], 16);
  EXPECT_EQ(j["kivi_residual"], 64);
  EXPECT_EQ(j["bounded"], true);
  // Fields that do not apply are null.
  const nlohmann::json plain = CacheSpec{}.to_json();
  EXPECT_TRUE(plain["rope"].is_null());
  EXPECT_TRUE(plain["kivi_group"].is_null());
  EXPECT_TRUE(plain["kivi_residual"].is_null());
  EXPECT_TRUE(plain["residual_dtype"].is_null());
  EXPECT_EQ(plain["window"], 0);
  EXPECT_EQ(plain["bounded"], false);
  EXPECT_TRUE(spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0).to_json()["kivi_residual"].is_null());
  // Round trip over a spread of specs: from_json(to_json(s)) == canonical(s).
  std::vector<CacheSpec> all = {kv, CacheSpec{}, spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0),
                                spec(KVStorage::BF16, 0, 64), spec(KVStorage::Int2, 8, 120)};
  for (KVStorage st : kAllStorages) all.push_back(spec(st, 4, 60, RopeMode::Absolute));
  for (KVStorage rd : {KVStorage::F32, KVStorage::BF16}) {
    CacheSpec r = spec(KVStorage::Int4, 4, 60);
    r.residual_dtype = rd;
    all.push_back(r);
    // Only a grouped cache has a residual: the simple scheme and fp32 drop it.
    CacheSpec simple = spec(KVStorage::Int4, 0, 0, RopeMode::Reposition, 0);
    simple.residual_dtype = rd;
    EXPECT_EQ(simple.canonical().residual_dtype, CacheSpec{}.residual_dtype);
    EXPECT_TRUE(simple.to_json()["residual_dtype"].is_null());
    // A non-default residual shows in the label, and json carries it.
    EXPECT_NE(r.label().find(std::string("res ") + std::string(storage_name(rd))), std::string::npos) << r.label();
    EXPECT_EQ(r.to_json()["residual_dtype"], storage_name(rd));
  }
  {
    CacheSpec t = spec(KVStorage::Int4, 4, 60);
    t.k_axis = KeyAxis::Token;
    t.rotate = KVRotate::Hadamard;
    all.push_back(t);
    EXPECT_EQ(t.to_json()["k_axis"], "token");
    EXPECT_EQ(t.to_json()["rotate"], "hadamard");
    EXPECT_NE(t.label().find("K per-token hadamard"), std::string::npos) << t.label();
    EXPECT_NE(t.describe().find("K int4 per-token"), std::string::npos) << t.describe();
    // Only grouped quantised keys have an axis: fp32 K (V int4) drops it.
    CacheSpec f = t;
    f.key_storage = KVStorage::F32;
    EXPECT_EQ(f.canonical().k_axis, KeyAxis::Channel);
    EXPECT_TRUE(f.to_json()["k_axis"].is_null());
    EXPECT_EQ(f.to_json()["rotate"], "hadamard");  // rotation applies to every storage
  }
  for (const CacheSpec& s : all) EXPECT_EQ(CacheSpec::from_json(s.to_json()), s.canonical()) << s.to_json().dump();
}

TEST(CacheSpec, FromJsonTakesTheServerObject) {
  const auto s = CacheSpec::from_json(nlohmann::json::parse(R"({"quantize": "int4", "sink": 4, "window": 252})"));
  EXPECT_EQ(s, spec(KVStorage::Int4, 4, 252).canonical());
  EXPECT_EQ(CacheSpec::from_json(nlohmann::json::object()), CacheSpec{});
  EXPECT_EQ(CacheSpec::from_json(nlohmann::json::parse(R"({"window": "16", "kivi_group": null})")),
            spec(KVStorage::F32, 0, 16).canonical());
}

TEST(CacheSpec, FromJsonRejectsWithTheField) {
  const auto issue_of = [](const char* text) -> SpecIssue {
    try {
      CacheSpec::from_json(nlohmann::json::parse(text));
    } catch (const CacheSpecError& e) {
      return e.issue();
    }
    return {"(none)", "", "", ""};
  };
  EXPECT_EQ(issue_of(R"({"quantise": "int4"})").field, "quantise");
  EXPECT_EQ(issue_of(R"({"quantise": "int4"})").value, "(unknown field)");
  EXPECT_EQ(issue_of(R"({"quantize": "int5"})").field, "quantize");
  EXPECT_EQ(issue_of(R"({"sink": 4})").field, "sink");  // no window
  EXPECT_EQ(issue_of(R"({"window": -1})").field, "window");
  EXPECT_EQ(issue_of(R"({"window": 1.5})").field, "window");
  EXPECT_EQ(issue_of(R"({"window": [1]})").expected, "a string or an integer");
  EXPECT_EQ(issue_of(R"({"window": 8, "bounded": false})").field, "bounded");
  EXPECT_EQ(issue_of(R"([1, 2])").field, "(object)");
  EXPECT_EQ(issue_of(R"({"quantize": "int4", "kivi_group": 32, "kivi_residual": 100})").field, "kivi_residual");
}

}  // namespace
}  // namespace ptllm
