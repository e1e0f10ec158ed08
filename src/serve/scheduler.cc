#include "serve/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/error.h"

namespace ptllm::serve {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

Scheduler::Scheduler(Backend& backend, SchedulerConfig cfg, Metrics* metrics)
    : backend_(backend), cfg_(cfg), metrics_(metrics) {
  if (cfg_.max_sequences < 1) fail("--max-sequences {}: expected >= 1", cfg_.max_sequences);
  if (cfg_.max_queue < 0) fail("--max-queue {}: expected >= 0", cfg_.max_queue);
  if (cfg_.compute_nice < 0 || cfg_.compute_nice > kMaxComputeNice)
    fail("--compute-nice {}: expected 0 to {} (a higher value yields the cores to the HTTP threads)", cfg_.compute_nice,
         kMaxComputeNice);
  if (cfg_.prefill_chunk < 1) fail("prefill chunk {}: expected >= 1", cfg_.prefill_chunk);
  if (const char* p = std::getenv("PTLLM_SERVE_TRACE"); p && *p) {
    trace_ = std::fopen(p, "w");
    if (!trace_) fail("PTLLM_SERVE_TRACE {}: cannot open for writing", p);
  }
  publish_gauges();
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& e : running_) finish(*e, FinishReason::Cancelled);
  for (auto& e : queue_) finish(e, FinishReason::Cancelled);
  if (trace_) std::fclose(trace_);
}

Admit Scheduler::submit(std::shared_ptr<Job> job, std::string* why) {
  if (draining_) return Admit::Draining;
  const size_t need = backend_.reservation_bytes(job->cache);  // outside the lock: may fill a throwaway cache
  if (need > cfg_.kv_budget) {
    if (why) *why = fmt::format("this kv_cache setting reserves {} bytes, more than the server's --kv-budget of {} bytes",
                                need, cfg_.kv_budget);
    return Admit::TooLarge;
  }
  {
    std::lock_guard lk(mu_);
    if (draining_) return Admit::Draining;
    // --max-queue counts requests that must wait: those beyond the free sequence slots.
    const int64_t free_slots = std::max<int64_t>(0, cfg_.max_sequences - int64_t(running_.size()));
    if (int64_t(queue_.size()) >= cfg_.max_queue + free_slots) return Admit::QueueFull;
    Entry e;
    e.job = std::move(job);
    e.reservation = need;
    e.submitted = Clock::now();
    queue_.push_back(std::move(e));
    woken_ = true;
  }
  cv_.notify_all();  // gauges are published by the next step (only that thread may read live caches)
  return Admit::Queued;
}

void Scheduler::wake() {
  {
    std::lock_guard lk(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void Scheduler::drain() {
  draining_ = true;
  wake();
}

bool Scheduler::idle() const {
  std::lock_guard lk(mu_);
  return queue_.empty() && running_.empty();
}
size_t Scheduler::reserved_bytes() const {
  std::lock_guard lk(mu_);
  return reserved_;
}
int64_t Scheduler::running() const {
  std::lock_guard lk(mu_);
  return int64_t(running_.size());
}
int64_t Scheduler::queued() const {
  std::lock_guard lk(mu_);
  return int64_t(queue_.size());
}

void Scheduler::finish(Entry& e, FinishReason r, const std::string& error) {
  if (metrics_) metrics_->finished(std::string(finish_reason_name(r)));
  if (e.job->on_finish) e.job->on_finish(r, error);
  e.seq.reset();  // frees the cache now, not when the HTTP side lets go of the job
}

void Scheduler::drop_cancelled() {
  std::vector<Entry> gone_queued;
  std::vector<std::unique_ptr<Entry>> gone_running;
  {
    std::lock_guard lk(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->job->cancelled) {
        gone_queued.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = running_.begin(); it != running_.end();) {
      if ((*it)->job->cancelled || !(*it)->error.empty()) {
        reserved_ -= (*it)->reservation;
        gone_running.push_back(std::move(*it));
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& e : gone_queued) finish(e, FinishReason::Cancelled);
  for (auto& e : gone_running)
    finish(*e, e->error.empty() ? FinishReason::Cancelled : FinishReason::Error, e->error);
}

void Scheduler::admit() {
  // Strict FIFO: the head waits for room even when a smaller request behind it
  // would fit, so a large request is never starved.
  for (;;) {
    Entry e;
    {
      std::lock_guard lk(mu_);
      if (queue_.empty() || int64_t(running_.size()) >= cfg_.max_sequences) return;
      if (reserved_ + queue_.front().reservation > cfg_.kv_budget) return;
      e = std::move(queue_.front());
      queue_.pop_front();
      reserved_ += e.reservation;
    }
    try {
      e.seq = backend_.start(e.job->prompt, e.job->cache, e.job->sampler);
      if (e.job->prompt_logprobs >= 0) backend_.record_prompt_logprobs(*e.seq, e.job->prompt_logprobs);
    } catch (const std::exception& ex) {
      {
        std::lock_guard lk(mu_);
        reserved_ -= e.reservation;
      }
      finish(e, FinishReason::Error, ex.what());
      continue;
    }
    if (metrics_) metrics_->prompt_tokens(int64_t(e.job->prompt.size()));
    std::lock_guard lk(mu_);
    running_.push_back(std::make_unique<Entry>(std::move(e)));
  }
}

void Scheduler::prefill() {
  // This step's chunks: in admission order, up to prefill_tokens_per_step tokens
  // (the chunk that crosses the limit still goes).
  int64_t budget = cfg_.prefill_tokens_per_step;
  std::vector<Entry*> entries;
  std::vector<Sequence*> seqs;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Entry& e = *running_[i];
    if (e.seq->prefilled()) continue;
    entries.push_back(&e);
    seqs.push_back(e.seq.get());
    budget -= std::min(cfg_.prefill_chunk, e.seq->prompt_remaining());
  }
  if (seqs.empty()) return;
  std::vector<std::string> errors(seqs.size());
  backend_.prefill_batch(seqs, cfg_.prefill_chunk, errors);
  std::vector<std::pair<Entry*, FinishReason>> done;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = *entries[i];
    if (!errors[i].empty()) {
      e.error = errors[i];  // removed as an error by drop_cancelled() before decode
      continue;
    }
    if (!e.seq->prefilled()) continue;
    if (e.job->prompt_logprobs >= 0 && e.job->on_prompt_logprobs) {
      try {
        e.job->on_prompt_logprobs(backend_.take_prompt_logprobs(*e.seq));
      } catch (const std::exception& ex) {
        e.error = ex.what();
        done.emplace_back(&e, FinishReason::Error);
        continue;
      }
    }
    if (e.job->max_tokens == 0) done.emplace_back(&e, FinishReason::Length);  // the prompt was all it asked for
  }
  if (!done.empty()) retire(done);
}

void Scheduler::retire(const std::vector<std::pair<Entry*, FinishReason>>& done, const std::string& error) {
  std::vector<std::unique_ptr<Entry>> finished;
  {
    std::lock_guard lk(mu_);
    for (auto& [ptr, r] : done)
      for (auto it = running_.begin(); it != running_.end(); ++it)
        if (it->get() == ptr) {
          reserved_ -= ptr->reservation;
          finished.push_back(std::move(*it));
          running_.erase(it);
          break;
        }
  }
  for (size_t i = 0; i < done.size(); ++i)
    finish(*finished[i], done[i].second, error.empty() ? finished[i]->error : error);
}

void Scheduler::emit(Entry& e, int32_t id) {
  const auto now = Clock::now();
  if (metrics_) {
    if (e.generated == 0)
      metrics_->time_to_first_token(std::chrono::duration<double>(now - e.submitted).count());
    else
      metrics_->inter_token_latency(std::chrono::duration<double>(now - e.last_token).count());
    metrics_->generated_tokens(1);
  }
  e.last_token = now;
  ++e.generated;
}

void Scheduler::decode() {
  std::vector<Entry*> batch;
  std::vector<Sequence*> seqs;
  for (auto& e : running_)
    if (e->seq->prefilled()) {
      batch.push_back(e.get());
      seqs.push_back(e->seq.get());
    }
  if (batch.empty()) return;
  if (metrics_) metrics_->batch_size(int64_t(batch.size()));
  std::vector<int32_t> ids(batch.size(), -1);
  std::vector<std::pair<Entry*, FinishReason>> done;
  std::string error;
  try {
    backend_.decode(seqs, ids);
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Entry& e = *batch[i];
    if (!error.empty()) {
      done.emplace_back(&e, FinishReason::Error);
      continue;
    }
    emit(e, ids[i]);
    const bool eos = backend_.is_eos(ids[i]) && !e.job->ignore_eos;
    if (!eos && e.job->logprobs >= 0 && e.job->on_logprobs) {
      try {
        e.job->on_logprobs(backend_.logprobs(*e.seq, ids[i], e.job->logprobs));
      } catch (const std::exception& ex) {
        e.error = ex.what();
        done.emplace_back(&e, FinishReason::Error);
        continue;
      }
    }
    if (eos)
      done.emplace_back(&e, FinishReason::Stop);
    else if (e.job->on_token && !e.job->on_token(ids[i]))
      done.emplace_back(&e, FinishReason::Stop);
    else if (e.generated >= e.job->max_tokens || backend_.full(*e.seq))
      done.emplace_back(&e, FinishReason::Length);
  }
  retire(done, error);
}

void Scheduler::publish_gauges() {
  if (!metrics_) return;
  Gauges g;
  {
    std::lock_guard lk(mu_);
    g.running = int64_t(running_.size());
    g.queued = int64_t(queue_.size());
    g.kv_reserved = reserved_;
    for (const auto& e : running_)
      if (e->seq) g.kv_in_use += e->seq->kv_bytes();
  }
  g.kv_budget = cfg_.kv_budget;
  g.kv_kept = backend_.kept_bytes();
  metrics_->set_gauges(g);
}

bool Scheduler::step() {
  bool had_work;
  {
    std::lock_guard lk(mu_);
    had_work = !queue_.empty() || !running_.empty();
  }
  const auto t0 = Clock::now();
  drop_cancelled();
  admit();
  prefill();
  const auto t1 = Clock::now();
  drop_cancelled();  // prefill errors, and cancellations that came in meanwhile
  decode();
  const auto t2 = Clock::now();
  publish_gauges();
  if (trace_ && had_work) {
    const auto us = [](auto d) { return (long long)std::chrono::duration_cast<std::chrono::microseconds>(d).count(); };
    std::fprintf(trace_, "%lld %lld %lld %zu\n", us(t0.time_since_epoch()), us(t1 - t0), us(t2 - t1), running_.size());
    std::fflush(trace_);
  }
  return had_work;
}

void Scheduler::loop() {
  for (;;) {
    const bool worked = step();
    std::unique_lock lk(mu_);
    if (stop_) return;
    // Idle: sleep until a submit/cancel; the timeout re-checks cancelled flags
    // set without a wake().
    if (!worked || (running_.empty() && !woken_))
      cv_.wait_for(lk, std::chrono::milliseconds(50), [this] { return stop_ || woken_; });
    woken_ = false;
    if (stop_) return;
  }
}

namespace {
// Lowers the calling thread's priority (Linux: a nice value per thread id; raising
// nice needs no privilege). Elsewhere a no-op.
void lower_this_thread(int nice) {
#ifdef __linux__
  if (nice > 0) setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), nice);
#else
  (void)nice;
#endif
}
}  // namespace

void Scheduler::start() {
  const int nice = cfg_.compute_nice;
#ifdef _OPENMP
  // omp_set_num_threads (--threads) sets the calling thread's team size only: a
  // new std::thread starts from the process default (every core), so the step
  // thread takes the size of the thread that starts it.
  const int threads = omp_get_max_threads();
  thread_ = std::thread([this, threads, nice] {
    omp_set_num_threads(threads);
    // Each thread of the team lowers itself. libgomp keeps this thread's team for
    // every later parallel region (and a thread it adds later inherits the nice of
    // the thread that creates it), so every step runs on lowered threads.
#pragma omp parallel
    lower_this_thread(nice);
    loop();
  });
#else
  thread_ = std::thread([this, nice] {
    lower_this_thread(nice);
    loop();
  });
#endif
}

}  // namespace ptllm::serve
