#include "serve/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace ptllm::serve {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_, name, count_);
}

namespace {
const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
const std::vector<double> kBatchBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256};

void gauge(std::string& out, const char* name, const char* help, double v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
}
void counter(std::string& out, const char* name, const char* help, uint64_t v) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
}
void labelled(std::string& out, const char* name, const char* help, const std::map<std::string, uint64_t>& m) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
  for (const auto& [reason, n] : m) out += fmt::format("{}{{reason=\"{}\"}} {}\n", name, reason, n);
}
void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  h.render(out, name);
}
}  // namespace

Metrics::Metrics() : ttft_(kLatencyBounds), itl_(kLatencyBounds), batch_(kBatchBounds) {
  // Every reason is listed from the start so a scraper sees 0, not a missing series.
  for (const char* r : {"queue_full", "draining", "too_large", "invalid", "unauthorized"}) rejected_[r] = 0;
  for (const char* r : {"stop", "length", "cancelled", "error"}) finished_[r] = 0;
}

void Metrics::set_gauges(const Gauges& g) {
  std::lock_guard lk(mu_);
  g_ = g;
}
Gauges Metrics::gauges() const {
  std::lock_guard lk(mu_);
  return g_;
}
void Metrics::rejected(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++rejected_[reason];
}
void Metrics::finished(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++finished_[reason];
}
void Metrics::prompt_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += uint64_t(n);
}
void Metrics::generated_tokens(int64_t n) {
  std::lock_guard lk(mu_);
  generated_tokens_ += uint64_t(n);
}
void Metrics::time_to_first_token(double s) {
  std::lock_guard lk(mu_);
  ttft_.observe(s);
}
void Metrics::inter_token_latency(double s) {
  std::lock_guard lk(mu_);
  itl_.observe(s);
}
void Metrics::batch_size(int64_t n) {
  std::lock_guard lk(mu_);
  batch_.observe(double(n));
}

std::string Metrics::render() const {
  std::lock_guard lk(mu_);
  std::string o;
  gauge(o, "ptllm_requests_running", "Requests admitted and generating (or prefilling)", double(g_.running));
  gauge(o, "ptllm_requests_queued", "Requests waiting for admission", double(g_.queued));
  labelled(o, "ptllm_requests_rejected_total", "Requests refused, by reason", rejected_);
  labelled(o, "ptllm_requests_finished_total", "Requests finished, by reason", finished_);
  counter(o, "ptllm_prompt_tokens_total", "Prompt tokens prefilled", prompt_tokens_);
  counter(o, "ptllm_generation_tokens_total", "Tokens generated", generated_tokens_);
  histogram(o, "ptllm_time_to_first_token_seconds", "From submission to the first generated token", ttft_);
  histogram(o, "ptllm_inter_token_latency_seconds", "Between consecutive tokens of one request", itl_);
  histogram(o, "ptllm_batch_size", "Sequences in each decode step", batch_);
  gauge(o, "ptllm_kv_bytes_reserved", "KV bytes reserved by admitted requests (their caches when full)",
        double(g_.kv_reserved));
  gauge(o, "ptllm_kv_bytes_in_use", "KV bytes (payload + scales) held by running requests' caches now",
        double(g_.kv_in_use));
  gauge(o, "ptllm_kv_bytes_budget", "The --kv-budget admission limit", double(g_.kv_budget));
  gauge(o, "ptllm_kv_bytes_kept", "Reservation bytes of finished requests' caches kept resident for the next ones",
        double(g_.kv_kept));
  return o;
}

}  // namespace ptllm::serve
