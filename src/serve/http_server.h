// The OpenAI-compatible HTTP layer over the scheduler (cpp-httplib): routes,
// API-key check, OpenAI-shaped errors, server-sent-event streaming with
// disconnect detection, and graceful draining.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/session.h"
#include "kv/cache_spec.h"
#include "serve/backend.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace httplib {
class Server;
}

namespace ptllm::serve {

// messages (validated array) -> prompt text with the generation prompt added.
// Null: the model has no chat template (chat requests get a 400).
using ChatRenderer = std::function<std::string(const nlohmann::json& messages)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;           // 0 = any free port (bind() returns it)
  std::string api_key;       // empty = no check
  std::string model_name;    // what /v1/models lists and responses echo
  size_t max_body = size_t(4) << 20;
  int http_threads = 64;     // connections served at once; more wait for a thread
  CacheSpec cache_defaults;
};

class HttpServer {
 public:
  HttpServer(ServerOptions opt, const LoadedModel& lm, Backend& backend, Scheduler& sched, Metrics& metrics,
             ChatRenderer chat);
  ~HttpServer();
  int bind();     // binds host:port; returns the port; throws Error
  void serve();   // blocks until stop()
  void stop();
  // New generation requests get 503 and /health reports draining; running ones go on.
  void begin_drain();
  int64_t in_flight() const { return in_flight_.load(); }  // generation responses not yet fully sent

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace ptllm::serve
