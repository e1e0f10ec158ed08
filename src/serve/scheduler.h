// Continuous batching with admission at a fixed KV memory budget.
//
// One loop (step()): drop cancelled requests and free their caches; admit
// waiting requests in FIFO order while their reservation fits in the budget
// and a sequence slot is free; feed each admitted prompt one chunk; then one
// decode step over every prefilled sequence together. A request reserves its
// cache's full size (Backend::reservation_bytes) when admitted and releases it
// when it finishes, so nothing running is ever preempted for memory.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/backend.h"
#include "serve/metrics.h"

namespace ptllm::serve {

enum class FinishReason { Stop, Length, Cancelled, Error };
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

// One request as the scheduler sees it. The callbacks run on the scheduler
// thread and must not block (they hand data to the HTTP thread).
struct Job {
  std::vector<int32_t> prompt;
  CacheSpec cache;
  SamplerConfig sampler;
  int64_t max_tokens = 16;  // 0: feed the prompt only (with prompt_logprobs: score it)
  bool ignore_eos = false;
  // OpenAI's logprobs: -1 off, else how many most likely tokens to list beside each chosen
  // one; on_logprobs then gets each generated token's, just before its on_token.
  int logprobs = -1;
  std::function<void(const StepLogprobs&)> on_logprobs;
  // The prompt's own logprobs (OpenAI's echo): -1 off, else as `logprobs`; on_prompt_logprobs
  // then gets, once the prompt is fed, one entry per prompt token after the first (token i
  // from the logits after token i - 1), before any generated token.
  int prompt_logprobs = -1;
  std::function<void(std::vector<StepLogprobs>)> on_prompt_logprobs;
  // Each generated token (EOS excluded); return false to stop (a stop string matched).
  std::function<bool(int32_t id)> on_token;
  // Exactly once per accepted job, after its last on_token.
  std::function<void(FinishReason, const std::string& error)> on_finish;
  std::atomic<bool> cancelled{false};  // set by the HTTP thread on disconnect
};

// Linux's lowest priority: nice values run from 0 (as started) to this.
constexpr int kMaxComputeNice = 19;

struct SchedulerConfig {
  size_t kv_budget = size_t(256) << 20;
  int64_t max_sequences = 16;
  int64_t max_queue = 64;
  int64_t prefill_chunk = 64;           // prompt tokens per sequence per step
  int64_t prefill_tokens_per_step = 128;  // all sequences together (at least one chunk per step)
  // Nice value (0 to kMaxComputeNice, Linux) for the step thread and its OpenMP team, leaving the HTTP
  // threads at the process's own: with two cores and spinning compute threads, a stream's
  // writer otherwise waits for a core and its token goes out a step or more late
  // (docs/SERVER.md, "Session 27"). 0 leaves every thread as it is.
  int compute_nice = 0;
};

enum class Admit { Queued, QueueFull, Draining, TooLarge };

class Scheduler {
 public:
  Scheduler(Backend& backend, SchedulerConfig cfg, Metrics* metrics = nullptr);
  ~Scheduler();  // stops the loop; pending jobs finish as Cancelled
  // Thread-safe. On TooLarge, *why says what did not fit.
  Admit submit(std::shared_ptr<Job> job, std::string* why = nullptr);
  // One iteration; returns false when there was nothing to do.
  bool step();
  void start();  // runs step() on a background thread until the destructor
  void wake();   // after setting a job's cancelled flag
  void drain();  // submit() returns Draining from now on
  bool draining() const { return draining_.load(); }
  bool idle() const;  // nothing queued or running
  size_t reserved_bytes() const;
  int64_t running() const;
  int64_t queued() const;

 private:
  using Clock = std::chrono::steady_clock;
  // PTLLM_SERVE_TRACE=FILE: one line per step that had work, "start_us
  // admit_and_prefill_us decode_us running" (start on the steady clock, which
  // is CLOCK_MONOTONIC, as Node's process.hrtime: scripts/serve_load.mjs's
  // PTLLM_LOAD_TRACE sets each client event beside it).
  FILE* trace_ = nullptr;
  struct Entry {
    std::shared_ptr<Job> job;
    size_t reservation = 0;
    Clock::time_point submitted, last_token;
    std::unique_ptr<Sequence> seq;
    int64_t generated = 0;
    std::string error;  // set when its prefill failed: removed as an error before decode
  };
  void finish(Entry& e, FinishReason r, const std::string& error = {});
  // Takes the entries out of running_, releases their reservations and finishes them (with
  // `error` where given, else each entry's own).
  void retire(const std::vector<std::pair<Entry*, FinishReason>>& done, const std::string& error = {});
  void drop_cancelled();
  void admit();
  void prefill();
  void decode();
  void emit(Entry& e, int32_t id);
  void publish_gauges();
  void loop();

  Backend& backend_;
  SchedulerConfig cfg_;
  Metrics* metrics_;
  mutable std::mutex mu_;  // guards queue_, running_ (list), reserved_, the flags
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  std::vector<std::unique_ptr<Entry>> running_;
  size_t reserved_ = 0;
  std::atomic<bool> draining_{false};
  bool stop_ = false, woken_ = false;
  std::thread thread_;
};

}  // namespace ptllm::serve
