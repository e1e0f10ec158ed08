// The HTTP layer in process, with a stand-in chat renderer (the real one is
// the jinja engine's): chat completions streamed and not, on stories260K.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "serve/engine_backend.h"
#include "serve/http_server.h"
#include "test_util.h"

namespace ptllm::serve {
namespace {

using nlohmann::json;

struct Fixture {
  LoadedModel lm = load_model(test::repo_dir() + "/models/stories260K");
  std::unique_ptr<Backend> backend = make_engine_backend(lm);
  Metrics metrics;
  Scheduler sched;
  std::vector<json> rendered;  // what the renderer was given
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  explicit Fixture(SchedulerConfig sc = {}) : sched(*backend, sc, &metrics) {
    ServerOptions o;
    o.port = 0;
    o.model_name = "stories260K";
    // "<role>: <content>\n" per message, then the generation prompt "assistant:".
    ChatRenderer chat = [this](const json& messages) {
      rendered.push_back(messages);
      std::string s;
      for (const auto& m : messages) s += m["role"].get<std::string>() + ": " + m["content"].get<std::string>() + "\n";
      return s + "assistant:";
    };
    http = std::make_unique<HttpServer>(o, lm, *backend, sched, metrics, chat);
    port = http->bind();
    sched.start();
    thread = std::thread([this] { http->serve(); });
  }
  ~Fixture() {
    http->stop();
    thread.join();
  }
};

TEST(ServeHttp, ChatCompletionMatchesTheRenderedPromptAsACompletion) {
  Fixture f;
  httplib::Client c("127.0.0.1", f.port);
  const json chat_req = {{"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                         {"max_completion_tokens", 20},
                         {"temperature", 0},
                         {"ignore_eos", true}};
  auto r = c.Post("/v1/chat/completions", chat_req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // The server's keep-alive timeout is announced, so clients close idle connections first.
  EXPECT_EQ(r->get_header_value("Keep-Alive"), "timeout=2");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);
  ASSERT_EQ(f.rendered.size(), 1u);
  EXPECT_EQ(f.rendered[0][0]["content"], "Once upon a time");
  // The same prompt text as a token-id completion (no BOS added: the template owns specials).
  const auto ids = f.lm.tokenizer->encode("user: Once upon a time\nassistant:", false);
  auto rc = c.Post("/v1/completions",
                   json{{"prompt", ids}, {"max_tokens", 20}, {"temperature", 0}, {"ignore_eos", true}}.dump(),
                   "application/json");
  ASSERT_TRUE(rc);
  EXPECT_EQ(json::parse(rc->body)["choices"][0]["text"], j["choices"][0]["message"]["content"]);
  EXPECT_EQ(json::parse(rc->body)["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"]);

  // Streamed: role first, content deltas, finish_reason + usage last, [DONE].
  json sreq = chat_req;
  sreq["stream"] = true;
  auto rs = c.Post("/v1/chat/completions", sreq.dump(), "application/json");
  ASSERT_TRUE(rs);
  ASSERT_EQ(rs->status, 200);
  EXPECT_EQ(rs->get_header_value("Content-Type"), "text/event-stream");
  std::vector<std::string> events;
  for (size_t p = 0; (p = rs->body.find("data: ", p)) != std::string::npos; p += 6)
    events.push_back(rs->body.substr(p + 6, rs->body.find("\n\n", p) - p - 6));
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events.front());
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
    if (i + 2 < events.size()) {
      EXPECT_TRUE(e["choices"][0]["finish_reason"].is_null());
    }
  }
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["usage"]["completion_tokens"], 20);
  EXPECT_EQ(text, j["choices"][0]["message"]["content"]);
}

TEST(ServeHttp, ARequestLargerThanTheWholeBudgetIs400) {
  // 100,000 bytes: an unbounded fp32 cache of stories260K reserves 5 layers x 4 KV heads
  // x 8 dims x 2 x 4 bytes x 512 tokens = 655,360; a 64-token bounded one at most 81,920.
  SchedulerConfig sc;
  sc.kv_budget = 100000;
  Fixture f(sc);
  httplib::Client c("127.0.0.1", f.port);
  auto r = c.Post("/v1/completions", R"({"prompt":"Once","max_tokens":3})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["param"], "kv_cache");
  EXPECT_EQ(e["code"], "kv_budget_exceeded");
  EXPECT_NE(e["message"].get<std::string>().find("655360"), std::string::npos) << e;
  auto ok = c.Post("/v1/completions", R"({"prompt":"Once","max_tokens":3,"kv_cache":{"sink":4,"window":60}})",
                   "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_NE(f.metrics.render().find("ptllm_requests_rejected_total{reason=\"too_large\"} 1"), std::string::npos);
}

}  // namespace
}  // namespace ptllm::serve
