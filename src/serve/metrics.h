// Server metrics in Prometheus' text exposition format (GET /metrics).
// Counters and histograms are updated by the scheduler and the HTTP layer;
// gauges are set by the scheduler once per step. Every method is thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ptllm::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // "<name>_bucket{le=...} n" lines (cumulative), _sum and _count.
  void render(std::string& out, const std::string& name) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds_.size() + 1], last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Gauges {
  int64_t running = 0, queued = 0;
  uint64_t kv_reserved = 0, kv_in_use = 0, kv_budget = 0, kv_kept = 0;
};

class Metrics {
 public:
  Metrics();
  void set_gauges(const Gauges& g);
  Gauges gauges() const;
  void rejected(const std::string& reason);  // queue_full, draining, too_large, invalid, unauthorized
  void finished(const std::string& reason);  // stop, length, cancelled, error
  void prompt_tokens(int64_t n);
  void generated_tokens(int64_t n);
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);
  void batch_size(int64_t n);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  Gauges g_;
  std::map<std::string, uint64_t> rejected_, finished_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, itl_, batch_;
};

}  // namespace ptllm::serve
