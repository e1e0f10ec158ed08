// Request parsing and validation: every bad field is a 400 that names itself
// (in the message and in "param"); StopText's hold-back of stop-string prefixes.
#include <gtest/gtest.h>

#include "serve/openai_schema.h"
#include "serve/stop_text.h"

namespace ptllm::serve {
namespace {

using nlohmann::json;

ApiError completion_error(const std::string& body) {
  try {
    parse_completion(parse_body(body), CacheSpec{}, 512);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

TEST(ServeSchema, BadJsonIs400) {
  for (const char* body : {"{bad", "", "[1,2]", "\"text\"", "{\"prompt\": \"a\""}) {
    ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_NE(std::string(e.what()).find("JSON"), std::string::npos) << body << ": " << e.what();
  }
}

TEST(ServeSchema, EveryBadFieldNamesItself) {
  // body -> the param it must name.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": [1, 2, 512]})", "prompt[2]"},
      {R"({"prompt": [1, -1]})", "prompt[1]"},
      {R"({"prompt": [[1, 512]]})", "prompt[0][1]"},
      {R"({"prompt": [[]]})", "prompt"},
      {R"({"prompt": [[1], [2]]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": "a", "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 1.5})", "max_tokens"},
      {R"({"prompt": "a", "temperature": "hot"})", "temperature"},
      {R"({"prompt": "a", "temperature": 3})", "temperature"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "a", "top_k": -1})", "top_k"},
      {R"({"prompt": "a", "seed": "x"})", "seed"},
      {R"({"prompt": "a", "n": 2})", "n"},
      {R"({"prompt": "a", "stream": "yes"})", "stream"},
      {R"({"prompt": "a", "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": "a", "stop": 3})", "stop"},
      {R"({"prompt": "a", "stop": ["x", 2]})", "stop[1]"},
      {R"({"prompt": "a", "stop": [""]})", "stop[0]"},
      {R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
      {R"({"prompt": "a", "model": 7})", "model"},
      {R"({"prompt": "a", "stream_options": 1})", "stream_options"},
      {R"({"prompt": "a", "presence_penalty": 2.5})", "presence_penalty"},
      {R"({"prompt": "a", "min_p": 1.5})", "min_p"},
      {R"({"prompt": "a", "min_p": "x"})", "min_p"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs"},
      {R"({"prompt": "a", "echo": 1})", "echo"},
      {R"({"prompt": "a", "echo": false, "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "logprobs": -1})", "logprobs"},
      {R"({"prompt": "a", "presence_penalty": "x"})", "presence_penalty"},
      {R"({"prompt": "a", "frequency_penalty": -3})", "frequency_penalty"},
      {R"({"prompt": "a", "logit_bias": [1]})", "logit_bias"},
      {R"({"prompt": "a", "logit_bias": {"x": 1}})", "logit_bias.x"},
      {R"({"prompt": "a", "logit_bias": {"12a": 1}})", "logit_bias.12a"},
      {R"({"prompt": "a", "logit_bias": {"512": 1}})", "logit_bias.512"},
      {R"({"prompt": "a", "logit_bias": {"-1": 1}})", "logit_bias.-1"},
      {R"({"prompt": "a", "logit_bias": {"7": 101}})", "logit_bias.7"},
      {R"({"prompt": "a", "logit_bias": {"7": "ban"}})", "logit_bias.7"},
      {R"({"prompt": "a", "kv_cache": "int4"})", "kv_cache"},
      {R"({"prompt": "a", "kv_cache": {"foo": 1}})", "kv_cache.foo"},
      {R"({"prompt": "a", "kv_cache": {"quantize": "int5"}})", "kv_cache.quantize"},
      {R"({"prompt": "a", "kv_cache": {"quantize_k": 4}})", "kv_cache.quantize_k"},
      {R"({"prompt": "a", "kv_cache": {"quantize_v": "q4"}})", "kv_cache.quantize_v"},
      {R"({"prompt": "a", "kv_cache": {"sink": -1, "window": 8}})", "kv_cache.sink"},
      {R"({"prompt": "a", "kv_cache": {"window": "8"}})", "kv_cache.window"},
      {R"({"prompt": "a", "kv_cache": {"rope": "alibi"}})", "kv_cache.rope"},
      {R"({"prompt": "a", "kv_cache": {"kivi_group": 1.5}})", "kv_cache.kivi_group"},
      {R"({"prompt": "a", "kv_cache": {"kivi_residual": -4}})", "kv_cache.kivi_residual"},
      {R"({"prompt": "a", "kv_cache": {"residual_dtype": 16}})", "kv_cache.residual_dtype"},
      {R"({"prompt": "a", "kv_cache": {"rotate": "quarot"}})", "kv_cache.rotate"},
      {R"({"prompt": "a", "kv_cache": {"k_axis": true}})", "kv_cache.k_axis"},
      // Cross-field: sinks without a window, a residual not a multiple of the group.
      {R"({"prompt": "a", "kv_cache": {"sink": 4}})", "kv_cache.sink"},
      {R"({"prompt": "a", "kv_cache": {"quantize": "int4", "kivi_group": 32, "kivi_residual": 40}})",
       "kv_cache.kivi_residual"},
  };
  for (const auto& [body, param] : cases) {
    ApiError e = completion_error(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(param + ":", 0), 0u) << body << ": " << e.what();
    const json j = error_json(e);
    EXPECT_EQ(j["error"]["param"], param);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"].contains("code"));
  }
}

TEST(ServeSchema, GoodCompletionRequest) {
  CacheSpec defaults;
  defaults.storage = KVStorage::BF16;
  const auto r = parse_completion(parse_body(R"({"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0,
      "top_p": 0.9, "top_k": 5, "seed": 42, "stop": ["\n", "The"], "stream": true, "ignore_eos": true,
      "n": 1, "user": "u", "logprobs": null, "kv_cache": {"quantize": "int4", "sink": 4, "window": 252}})"),
                                  defaults, 512);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(std::get<std::string>(r.prompt), "hi");
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_EQ(r.gen.sampler.temperature, 0.0);
  EXPECT_EQ(r.gen.sampler.top_p, 0.9);
  EXPECT_EQ(r.gen.sampler.top_k, 5);
  EXPECT_TRUE(r.gen.seeded);
  EXPECT_EQ(r.gen.sampler.seed, 42u);
  EXPECT_EQ(r.gen.stop, (std::vector<std::string>{"\n", "The"}));
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.ignore_eos);
  EXPECT_EQ(r.gen.cache.storage, KVStorage::Int4);
  EXPECT_EQ(r.gen.cache.sink, 4);
  EXPECT_EQ(r.gen.cache.window, 252);
  const auto pen = parse_completion(parse_body(R"({"prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": -1.25,
      "logit_bias": {"13": -100, "511": 2.5}})"), defaults, 512);
  EXPECT_EQ(pen.gen.sampler.presence_penalty, 0.5);
  EXPECT_EQ(parse_completion(parse_body(R"({"prompt": "hi", "min_p": 0.05})"), defaults, 512).gen.sampler.min_p, 0.05);
  EXPECT_EQ(pen.gen.sampler.frequency_penalty, -1.25);
  EXPECT_EQ(pen.gen.sampler.logit_bias, (std::vector<std::pair<int32_t, float>>{{13, -100.f}, {511, 2.5f}}));
  // Without kv_cache the server's defaults apply.
  const auto d = parse_completion(parse_body(R"({"prompt": [1, 2, 511]})"), defaults, 512);
  EXPECT_EQ(std::get<std::vector<int32_t>>(d.prompt), (std::vector<int32_t>{1, 2, 511}));
  const auto nested = parse_completion(parse_body(R"({"prompt": [[1, 2, 511]]})"), defaults, 512);
  EXPECT_EQ(std::get<std::vector<int32_t>>(nested.prompt), (std::vector<int32_t>{1, 2, 511}));
  EXPECT_EQ(d.gen.cache.storage, KVStorage::BF16);
  EXPECT_EQ(d.gen.max_tokens, 16);
  EXPECT_EQ(d.gen.sampler.temperature, 1.0);
  EXPECT_FALSE(d.gen.seeded);
  EXPECT_EQ(d.gen.sampler.presence_penalty, 0.0);
  EXPECT_EQ(d.gen.sampler.frequency_penalty, 0.0);
  EXPECT_TRUE(d.gen.sampler.logit_bias.empty());
  EXPECT_EQ(d.gen.logprobs, -1);
  EXPECT_EQ(parse_completion(parse_body(R"({"prompt": "hi", "logprobs": 3})"), defaults, 512).gen.logprobs, 3);
  EXPECT_EQ(parse_completion(parse_body(R"({"prompt": "hi", "logprobs": 0})"), defaults, 512).gen.logprobs, 0);
  const auto echo = parse_completion(parse_body(R"({"prompt": "hi", "echo": true, "max_tokens": 0})"), defaults, 512);
  EXPECT_TRUE(echo.gen.echo);
  EXPECT_EQ(echo.gen.max_tokens, 0);
  EXPECT_FALSE(d.gen.echo);
}

TEST(ServeSchema, KvCacheOverridesOnlyWhatItNames) {
  CacheSpec defaults;
  defaults.storage = KVStorage::Int8;
  defaults.sink = 4;
  defaults.window = 60;
  const CacheSpec o = parse_kv_cache(json{{"quantize_v", "int2"}}, defaults);
  EXPECT_EQ(o.k_storage(), KVStorage::Int8);
  EXPECT_EQ(o.v_storage(), KVStorage::Int2);
  EXPECT_EQ(o.sink, 4);
  EXPECT_EQ(o.window, 60);
  // The string fields CacheSpec added (issue 16) come through by CacheSpec::field_kind.
  const CacheSpec r = parse_kv_cache(json{{"residual_dtype", "bf16"}, {"rotate", "hadamard"}, {"k_axis", "token"}},
                                     defaults);
  EXPECT_EQ(r.residual_dtype, KVStorage::BF16);
  EXPECT_EQ(r.rotate, KVRotate::Hadamard);
  EXPECT_EQ(r.k_axis, KeyAxis::Token);
  const CacheSpec u = parse_kv_cache(json{{"sink", 0}, {"window", 0}}, defaults);
  EXPECT_FALSE(u.streaming());
}

TEST(ServeSchema, ChatRequest) {
  const auto r = parse_chat(parse_body(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9,
                                          "max_tokens": 3})"),
                            CacheSpec{}, 100);
  EXPECT_EQ(r.gen.max_tokens, 9);  // the newer name wins
  EXPECT_EQ(r.gen.logprobs, -1);
  const auto chat_lp = [](const char* extra) {
    return parse_chat(parse_body(std::string(R"({"messages": [{"role": "user", "content": "hi"}])") + extra + "}"),
                      CacheSpec{}, 100).gen.logprobs;
  };
  EXPECT_EQ(chat_lp(R"(, "logprobs": true)"), 0);
  EXPECT_EQ(chat_lp(R"(, "logprobs": true, "top_logprobs": 20)"), 20);
  EXPECT_EQ(chat_lp(R"(, "logprobs": false)"), -1);
  EXPECT_EQ(r.messages.size(), 1u);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [1]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": "x"}, {"role": 3, "content": "x"}]})", "messages[1].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -2})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 3})", "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})", "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 3})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs"},
  };
  for (const auto& [body, param] : cases) {
    try {
      parse_chat(parse_body(body), CacheSpec{}, 100);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << body << ": " << e.what();
    }
  }
}

TEST(ServeStopText, HoldsBackPrefixesAndCutsAtTheStop) {
  StopText s({"END", "\n\n"});
  EXPECT_EQ(s.push("Hello E"), "Hello ");  // "E" may start "END"
  EXPECT_EQ(s.push("x"), "Ex");            // it did not
  EXPECT_EQ(s.push(" and E"), " and ");
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("D tail"), "");  // stop: the text before it was already out, the rest dropped
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "Hello Ex and ");
  EXPECT_EQ(s.push("more"), "");
}

TEST(ServeStopText, MatchInsideOnePieceAndFlush) {
  StopText a({"\n\n"});
  EXPECT_EQ(a.push("one\n\ntwo"), "one");
  EXPECT_TRUE(a.stopped());
  StopText b({"STOP"});
  EXPECT_EQ(b.push("abc ST"), "abc ");
  EXPECT_EQ(b.flush(), "ST");  // generation ended otherwise: nothing is lost
  EXPECT_FALSE(b.stopped());
  StopText none({});
  EXPECT_EQ(none.push("x"), "x");
}

}  // namespace
}  // namespace ptllm::serve
