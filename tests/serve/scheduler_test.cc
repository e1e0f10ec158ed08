// The scheduler against a fake backend (FIFO, admission by bytes, 429 at the
// queue bound, cancellation frees bytes, draining, chunked prefill, stop
// conditions), and batch invariance with the real engine on stories260K.
#include <gtest/gtest.h>

#include <map>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "engine/session.h"
#include "model/device_cache.h"
#include "serve/engine_backend.h"
#include "serve/scheduler.h"
#include "test_util.h"

namespace ptllm::serve {
namespace {

constexpr int32_t kEos = 999;

// Reservation = 10 bytes per window token (1000 when unbounded). Token i of a
// sequence is prompt[0] + i, or kEos once i reaches prompt[1] when the prompt
// has two ids. kv_bytes grows 1 per token fed or generated.
class FakeBackend : public Backend {
 public:
  struct Seq : Sequence {
    std::vector<int32_t> prompt;
    int64_t fed = 0, generated = 0;
    bool prompt_lp = false;
    size_t kv_bytes() const override { return size_t(fed + generated); }
    bool prefilled() const override { return fed == int64_t(prompt.size()); }
    int64_t prompt_remaining() const override { return int64_t(prompt.size()) - fed; }
  };
  size_t reservation_bytes(const CacheSpec& o) override { return o.window > 0 ? size_t(o.window) * 10 : 1000; }
  int64_t context_length() const override { return 512; }
  bool is_eos(int32_t id) const override { return id == kEos; }
  std::unique_ptr<Sequence> start(std::vector<int32_t> prompt, const CacheSpec&, const SamplerConfig&) override {
    auto s = std::make_unique<Seq>();
    s->prompt = std::move(prompt);
    ++live;
    started.push_back(s->prompt[0]);
    return s;
  }
  void prefill(Sequence& base, int64_t max_tokens) override {
    auto& s = static_cast<Seq&>(base);
    const int64_t n = std::min(max_tokens, s.prompt_remaining());
    prefill_calls.push_back(n);
    s.fed += n;
  }
  void decode(std::span<Sequence* const> seqs, std::span<int32_t> out) override {
    batch_sizes.push_back(int64_t(seqs.size()));
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto& s = static_cast<Seq&>(*seqs[i]);
      out[i] = s.prompt.size() == 2 && s.generated >= s.prompt[1] ? kEos : s.prompt[0] + int32_t(s.generated);
      ++s.generated;
    }
  }
  // Token t's logprob is -t / 1000 (so a test can tell which token's it is), the top list
  // t + 1, t + 2, ...
  StepLogprobs logprobs(const Sequence&, int32_t id, int top) const override {
    StepLogprobs lp;
    lp.chosen = {id, -double(id) / 1000};
    for (int i = 0; i < top; ++i) lp.top.push_back({id + 1 + i, -double(id + 1 + i) / 1000});
    return lp;
  }
  // Prompt token i's logprob is -i / 100, recorded as the prompt is fed.
  void record_prompt_logprobs(Sequence& base, int) override { static_cast<Seq&>(base).prompt_lp = true; }
  std::vector<StepLogprobs> take_prompt_logprobs(Sequence& base) override {
    auto& s = static_cast<Seq&>(base);
    std::vector<StepLogprobs> out;
    if (!s.prompt_lp) return out;
    for (size_t i = 1; i < s.prompt.size(); ++i) out.push_back({{s.prompt[i], -double(i) / 100}, {}});
    return out;
  }
  bool full(const Sequence&) const override { return false; }
  int live = 0;  // not counting destruction: see Tracked
  std::vector<int32_t> started;
  std::vector<int64_t> prefill_calls, batch_sizes;
};

struct Record {
  std::vector<int32_t> tokens;
  int finishes = 0;
  FinishReason reason = FinishReason::Error;
};

std::shared_ptr<Job> make_job(std::vector<int32_t> prompt, Record& rec, int64_t max_tokens = 4, int64_t window = 0) {
  auto j = std::make_shared<Job>();
  j->prompt = std::move(prompt);
  j->max_tokens = max_tokens;
  j->cache.window = window;
  j->on_token = [&rec](int32_t id) {
    rec.tokens.push_back(id);
    return true;
  };
  j->on_finish = [&rec](FinishReason r, const std::string&) {
    ++rec.finishes;
    rec.reason = r;
  };
  return j;
}

SchedulerConfig config(size_t budget, int64_t max_seq = 16, int64_t max_queue = 16) {
  SchedulerConfig c;
  c.kv_budget = budget;
  c.max_sequences = max_seq;
  c.max_queue = max_queue;
  c.prefill_chunk = 4;
  c.prefill_tokens_per_step = 8;
  return c;
}

void run_until_idle(Scheduler& s) {
  for (int i = 0; i < 1000 && !s.idle(); ++i) s.step();
  ASSERT_TRUE(s.idle());
}

TEST(ServeScheduler, FifoWhenOnlyOneFits) {
  FakeBackend b;
  Scheduler s(b, config(1000));  // each unbounded request reserves 1000
  Record r1, r2, r3;
  ASSERT_EQ(s.submit(make_job({10}, r1)), Admit::Queued);
  ASSERT_EQ(s.submit(make_job({20}, r2)), Admit::Queued);
  ASSERT_EQ(s.submit(make_job({30}, r3)), Admit::Queued);
  s.step();
  EXPECT_EQ(s.running(), 1);
  EXPECT_EQ(s.queued(), 2);
  EXPECT_EQ(s.reserved_bytes(), 1000u);
  run_until_idle(s);
  EXPECT_EQ(b.started, (std::vector<int32_t>{10, 20, 30}));
  EXPECT_EQ(r1.tokens, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(r3.tokens, (std::vector<int32_t>{30, 31, 32, 33}));
  for (const Record* r : {&r1, &r2, &r3}) {
    EXPECT_EQ(r->finishes, 1);
    EXPECT_EQ(r->reason, FinishReason::Length);
  }
  // Never two at once: every decode step had one sequence.
  for (int64_t n : b.batch_sizes) EXPECT_EQ(n, 1);
  EXPECT_EQ(s.reserved_bytes(), 0u);
}

TEST(ServeScheduler, AdmitsByBytesAndHeadOfLineWaits) {
  FakeBackend b;
  Scheduler s(b, config(250));
  Record a, c, d, e;
  s.submit(make_job({1}, a, 6, /*window*/ 10));    // 100 bytes
  s.submit(make_job({2}, c, 6, 10));               // 100
  s.submit(make_job({3}, d, 6, 10));               // 100: does not fit beside the two
  s.submit(make_job({4}, e, 6, 1));                // 10: would fit, but FIFO keeps it behind
  s.step();
  EXPECT_EQ(s.running(), 2);
  EXPECT_EQ(s.reserved_bytes(), 200u);
  EXPECT_EQ(s.queued(), 2);
  run_until_idle(s);
  EXPECT_EQ(b.started, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(b.batch_sizes.front(), 2);
  EXPECT_EQ(s.reserved_bytes(), 0u);
}

TEST(ServeScheduler, MaxSequencesBoundsTheBatch) {
  FakeBackend b;
  Scheduler s(b, config(size_t(1) << 30, /*max_seq*/ 3));
  std::vector<Record> recs(7);
  for (size_t i = 0; i < recs.size(); ++i) s.submit(make_job({int32_t(100 * i)}, recs[i]));
  run_until_idle(s);
  for (int64_t n : b.batch_sizes) EXPECT_LE(n, 3);
  EXPECT_EQ(*std::max_element(b.batch_sizes.begin(), b.batch_sizes.end()), 3);
  for (const auto& r : recs) EXPECT_EQ(r.tokens.size(), 4u);
}

TEST(ServeScheduler, QueueBoundAndTooLarge) {
  FakeBackend b;
  Scheduler s(b, config(1000, /*max_seq*/ 1, /*max_queue*/ 1));  // one free slot + one waiting
  Record r1, r2, r3, big;
  EXPECT_EQ(s.submit(make_job({1}, r1)), Admit::Queued);
  EXPECT_EQ(s.submit(make_job({2}, r2)), Admit::Queued);
  EXPECT_EQ(s.submit(make_job({3}, r3)), Admit::QueueFull);
  s.step();  // 1 admitted: the slot is taken, one may wait
  Record r5;
  EXPECT_EQ(s.queued(), 1);
  EXPECT_EQ(s.submit(make_job({5}, r5)), Admit::QueueFull);
  std::string why;
  EXPECT_EQ(s.submit(make_job({4}, big, 4, /*window*/ 101), &why), Admit::TooLarge);  // 1010 > 1000
  EXPECT_NE(why.find("1010"), std::string::npos) << why;
  run_until_idle(s);
  EXPECT_EQ(r3.finishes, 0);  // refused jobs are never finished by the scheduler
  EXPECT_EQ(big.finishes, 0);
  EXPECT_EQ(r1.finishes, 1);
  EXPECT_EQ(r2.finishes, 1);
  EXPECT_EQ(r5.finishes, 0);
}

TEST(ServeScheduler, CancellationFreesBytesAtTheNextStep) {
  FakeBackend b;
  Metrics m;
  Scheduler s(b, config(1000), &m);
  Record run, wait;
  auto j1 = make_job({5}, run, 1000);
  auto j2 = make_job({6}, wait, 1000);
  s.submit(j1);
  s.submit(j2);
  for (int i = 0; i < 3; ++i) s.step();
  EXPECT_EQ(s.reserved_bytes(), 1000u);
  EXPECT_GT(m.gauges().kv_in_use, 0u);
  j2->cancelled = true;  // cancelled while queued
  j1->cancelled = true;  // and while running
  s.step();
  EXPECT_EQ(run.finishes, 1);
  EXPECT_EQ(run.reason, FinishReason::Cancelled);
  EXPECT_EQ(wait.finishes, 1);
  EXPECT_EQ(wait.reason, FinishReason::Cancelled);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(s.reserved_bytes(), 0u);
  EXPECT_EQ(m.gauges().kv_in_use, 0u);
  EXPECT_EQ(m.gauges().kv_reserved, 0u);
  EXPECT_NE(m.render().find("ptllm_requests_finished_total{reason=\"cancelled\"} 2"), std::string::npos);
}

TEST(ServeScheduler, DrainingRefusesNewButFinishesRunning) {
  FakeBackend b;
  Scheduler s(b, config(1000));
  Record r1, r2, late;
  s.submit(make_job({1}, r1));
  s.submit(make_job({2}, r2));
  s.step();
  s.drain();
  EXPECT_EQ(s.submit(make_job({3}, late)), Admit::Draining);
  run_until_idle(s);
  EXPECT_EQ(r1.tokens.size(), 4u);
  EXPECT_EQ(r2.tokens.size(), 4u);  // queued before draining: still served
  EXPECT_EQ(late.finishes, 0);
}

TEST(ServeScheduler, StopConditions) {
  FakeBackend b;
  Scheduler s(b, config(1 << 20));
  Record eos, ign, stop;
  s.submit(make_job({7, 2}, eos, 10));  // EOS as the 3rd token
  auto j = make_job({7, 2}, ign, 5);
  j->ignore_eos = true;
  s.submit(j);
  auto k = make_job({40}, stop, 10);
  k->on_token = [&stop](int32_t id) {
    stop.tokens.push_back(id);
    return id < 42;  // a stop string matched at 42
  };
  s.submit(k);
  run_until_idle(s);
  EXPECT_EQ(eos.tokens, (std::vector<int32_t>{7, 8}));  // EOS not handed on
  EXPECT_EQ(eos.reason, FinishReason::Stop);
  EXPECT_EQ(ign.tokens, (std::vector<int32_t>{7, 8, kEos, kEos, kEos}));
  EXPECT_EQ(ign.reason, FinishReason::Length);
  EXPECT_EQ(stop.tokens, (std::vector<int32_t>{40, 41, 42}));
  EXPECT_EQ(stop.reason, FinishReason::Stop);
}

// A job asking for logprobs gets each handed-on token's just before the token (EOS, not
// handed on, gets none); a job that does not ask gets no call.
TEST(ServeScheduler, LogprobsPrecedeEachToken) {
  FakeBackend b;
  Scheduler s(b, config(1 << 20));
  Record with, without;
  std::vector<std::pair<int32_t, size_t>> seen;  // (chosen id, top count) in order
  std::vector<int32_t> order;                     // logprob ids as +id, tokens as -id
  auto j = make_job({7, 2}, with, 10);            // 7, 8, then EOS
  j->logprobs = 2;
  j->on_logprobs = [&](const StepLogprobs& lp) {
    seen.emplace_back(lp.chosen.id, lp.top.size());
    order.push_back(lp.chosen.id);
  };
  j->on_token = [&](int32_t id) {
    with.tokens.push_back(id);
    order.push_back(-id);
    return true;
  };
  s.submit(j);
  auto k = make_job({20}, without, 3);
  int calls = 0;
  k->on_logprobs = [&](const StepLogprobs&) { ++calls; };  // logprobs stays -1
  s.submit(k);
  run_until_idle(s);
  EXPECT_EQ(seen, (std::vector<std::pair<int32_t, size_t>>{{7, 2}, {8, 2}}));
  EXPECT_EQ(order, (std::vector<int32_t>{7, -7, 8, -8}));
  EXPECT_EQ(with.reason, FinishReason::Stop);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(without.tokens, (std::vector<int32_t>{20, 21, 22}));
}

// Prompt logprobs come once the whole prompt is fed (over several chunks), before any
// generated token; max_tokens 0 feeds the prompt and finishes with no token.
TEST(ServeScheduler, PromptLogprobsAndPromptOnlyJobs) {
  FakeBackend b;
  Scheduler s(b, config(1 << 20));  // chunks of 4
  Record gen, only;
  std::vector<std::string> order;
  auto j = make_job({30, 31, 32, 33, 34, 35}, gen, 2);
  j->prompt_logprobs = 0;
  j->on_prompt_logprobs = [&](std::vector<StepLogprobs> lp) {
    order.push_back("prompt " + std::to_string(lp.size()) + " " + std::to_string(lp.front().chosen.id));
  };
  j->on_token = [&](int32_t id) {
    order.push_back("token " + std::to_string(id));
    return true;
  };
  s.submit(j);
  auto k = make_job({50, 51, 52}, only, 0);
  int prompt_calls = 0;
  k->prompt_logprobs = 1;
  k->on_prompt_logprobs = [&](std::vector<StepLogprobs> lp) { prompt_calls += int(lp.size()); };
  s.submit(k);
  run_until_idle(s);
  EXPECT_EQ(order, (std::vector<std::string>{"prompt 5 31", "token 30", "token 31"}));
  EXPECT_EQ(only.tokens, std::vector<int32_t>{});
  EXPECT_EQ(only.finishes, 1);
  EXPECT_EQ(only.reason, FinishReason::Length);
  EXPECT_EQ(prompt_calls, 2);
  EXPECT_EQ(s.reserved_bytes(), 0u);
}

TEST(ServeScheduler, ChunkedPrefillKeepsRunningStreamsDecoding) {
  FakeBackend b;
  Scheduler s(b, config(1 << 20));
  Record shortr, longr;
  s.submit(make_job({1}, shortr, 50));
  s.step();  // short one prefilled and decoding
  std::vector<int32_t> long_prompt(10, 3);
  s.submit(make_job(long_prompt, longr, 2));
  b.prefill_calls.clear();
  const size_t before = shortr.tokens.size();
  s.step();  // chunk 4 of 10
  s.step();  // 8 of 10
  EXPECT_EQ(shortr.tokens.size(), before + 2);  // one token per step meanwhile
  EXPECT_TRUE(longr.tokens.empty());
  s.step();  // 10 of 10, then its first token in the same step
  EXPECT_EQ(b.prefill_calls, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(longr.tokens.size(), 1u);
  run_until_idle(s);
}

TEST(ServeScheduler, BackgroundThreadAndDestructorFinishesPending) {
  FakeBackend b;
  Record r1, r2;
  {
    Scheduler s(b, config(1000));
    s.start();
    s.submit(make_job({1}, r1, 3));
    for (int i = 0; i < 200 && r1.finishes == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(r1.finishes, 1);
    auto j = make_job({2}, r2, int64_t(1) << 40);
    s.submit(j);
  }
  EXPECT_EQ(r2.finishes, 1);  // whatever state it was in, it got exactly one finish
}

#ifdef __linux__
// --compute-nice: the step thread and every thread of its OpenMP team (the ones a
// step's kernels run on) have the nice value; the thread that started the
// scheduler (an HTTP thread's stand-in) keeps its own.
TEST(ServeScheduler, ComputeNiceLowersTheStepThreadAndItsTeam) {
  struct NiceBackend : FakeBackend {
    std::mutex mu;
    std::vector<int> seen;  // nice values seen during decode: the step thread's, then its team's
    void decode(std::span<Sequence* const> seqs, std::span<int32_t> out) override {
      const auto nice_here = [] { return getpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid))); };
      std::lock_guard lk(mu);
      seen.push_back(nice_here());
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
      {
        const int n = nice_here();
#pragma omp critical
        seen.push_back(n);
      }
#endif
      FakeBackend::decode(seqs, out);
    }
  };
  const int mine = getpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)));
  ASSERT_LT(mine, 19) << "the test needs a thread below nice 19 to tell the change";
  NiceBackend b;
  Record rec;
  {
    SchedulerConfig c = config(1000);
    c.compute_nice = 19;
    Scheduler s(b, c);
    s.start();
    s.submit(make_job({1}, rec, 3));
    for (int i = 0; i < 400 && rec.finishes == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(rec.finishes, 1);
  std::lock_guard lk(b.mu);
  ASSERT_FALSE(b.seen.empty());
  for (int n : b.seen) EXPECT_EQ(n, 19);
  EXPECT_EQ(getpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid))), mine);
}
#endif

TEST(ServeScheduler, ComputeNiceOutOfRangeIsAnError) {
  FakeBackend b;
  SchedulerConfig c = config(1000);
  c.compute_nice = 20;
  EXPECT_THROW(Scheduler(b, c), Error);
  c.compute_nice = -1;
  EXPECT_THROW(Scheduler(b, c), Error);
}

// --- the real engine ---

const LoadedModel& stories() {
  static LoadedModel lm = load_model(test::repo_dir() + "/models/stories260K");
  return lm;
}

// The tokens of one request (n tokens, EOS ignored) run on backend b, after
// `others` requests with different prompts, lengths and seeds submitted first,
// so the request under test shares every decode step with them.
std::vector<int32_t> run_among(Backend& b, const std::vector<int32_t>& prompt, const SamplerConfig& sc,
                               const CacheSpec& co, int others, int64_t n) {
  Scheduler s(b, config(size_t(1) << 30, 16));
  Record rec;
  std::vector<Record> other;
  other.resize(size_t(others));
  for (int i = 0; i < others; ++i) {
    std::vector<int32_t> p = {1, int32_t(300 + i), int32_t(20 + 3 * i)};
    for (int k = 0; k < i; ++k) p.push_back(int32_t(100 + k));
    auto j = make_job(p, other[size_t(i)], 40 + i);
    j->sampler = SamplerConfig{0.9, 20, 0.95, uint64_t(1000 + i)};
    j->ignore_eos = true;
    s.submit(j);
  }
  auto j = make_job(prompt, rec, n);
  j->sampler = sc;
  j->cache = co;
  j->ignore_eos = true;
  s.submit(j);
  for (int i = 0; i < 2000 && !s.idle(); ++i) s.step();
  EXPECT_EQ(rec.finishes, 1);
  return rec.tokens;
}

std::vector<int32_t> run_alone_or_with(const std::vector<int32_t>& prompt, const SamplerConfig& sc,
                                       const CacheSpec& co, int others) {
  auto backend = make_engine_backend(stories());
  return run_among(*backend, prompt, sc, co, others, 48);
}

// A bounded quantised cache that stories260K's requests run past (evicting).
CacheSpec int4_sink4_window28() {
  CacheSpec c;
  c.storage = KVStorage::Int4;
  c.sink = 4;
  c.window = 28;
  return c;
}

TEST(ServeScheduler, BatchInvarianceWithTheEngine) {
  const std::vector<int32_t> prompt = stories().tokenizer->encode("Once upon a time", true);
  const CacheSpec bounded = int4_sink4_window28();
  for (const SamplerConfig& sc : {SamplerConfig{0.0, 0, 1.0, 0}, SamplerConfig{1.0, 40, 0.9, 7}})
    for (const CacheSpec& co : {CacheSpec{}, bounded}) {
      const auto alone = run_alone_or_with(prompt, sc, co, 0);
      const auto crowd = run_alone_or_with(prompt, sc, co, 15);
      EXPECT_EQ(alone.size(), 48u);
      EXPECT_EQ(alone, crowd) << "temperature " << sc.temperature << ", " << co.describe();
    }
}

TEST(ServeScheduler, GreedyMatchesSession) {
  // The scheduler's token loop against Session::generate (the CLI's path).
  const LoadedModel& lm = stories();
  const std::vector<int32_t> prompt = lm.tokenizer->encode("Once upon a time", true);
  Session session(lm, make_default_cache(*lm.model, 512));
  std::vector<int32_t> ref;
  GenerateOptions go;
  go.max_new_tokens = 48;
  go.ignore_eos = true;
  session.generate(prompt, go, [&](int32_t id) {
    ref.push_back(id);
    return true;
  });
  EXPECT_EQ(run_alone_or_with(prompt, SamplerConfig{}, CacheSpec{}, 3), ref);
}

TEST(ServeEngineBackend, ReservationIsTheFullCacheBytes) {
  const Model& m = *stories().model;
  // stories260K: 5 layers, 4 KV heads x head_dim 8, context 512. K and V.
  const size_t per_token_f32 = 2 * 5 * 4 * 8 * sizeof(float);
  EXPECT_EQ(full_cache_bytes(m, CacheSpec{}), per_token_f32 * 512);
  CacheSpec b;
  b.storage = KVStorage::F16;
  b.sink = 4;
  b.window = 252;
  EXPECT_EQ(full_cache_bytes(m, b), per_token_f32 / 2 * 256);
  // A quantised bounded cache: less than its fp16 twin, and at least what a
  // cache run far past its window holds at any point. (With a window not much
  // larger than the residual, a KIVI cache can be all full-precision rows.)
  CacheSpec q = b;
  q.storage = KVStorage::Int4;
  q.kivi_residual = 32;
  const size_t reserve = full_cache_bytes(m, q);
  EXPECT_LT(reserve, full_cache_bytes(m, b));
  auto backend = make_engine_backend(stories());
  EXPECT_EQ(backend->reservation_bytes(q), reserve);
  auto seq = backend->start(std::vector<int32_t>(700, 5), q, SamplerConfig{});
  size_t most = 0;
  while (!seq->prefilled()) {
    backend->prefill(*seq, 7);
    most = std::max(most, seq->kv_bytes());
  }
  EXPECT_LE(most, reserve);
  EXPECT_GT(most, reserve / 2);
}

// Finished requests' caches are kept (cleared) for later requests with the same
// settings, within the limit: a later request on a reused cache generates the
// tokens it generates on a new one.
TEST(ServeEngineBackend, KeptCachesGiveTheSameTokens) {
  const std::vector<int32_t> prompt = stories().tokenizer->encode("Once upon a time", true);
  const CacheSpec bounded = int4_sink4_window28();
  const SamplerConfig sc{1.0, 40, 0.9, 7};
  for (const CacheSpec& co : {CacheSpec{}, bounded}) {
    SCOPED_TRACE(co.describe());
    auto fresh = make_engine_backend(stories());
    const auto ref = run_among(*fresh, prompt, sc, co, 0, 60);
    const size_t per = fresh->reservation_bytes(co);
    EXPECT_EQ(fresh->kept_bytes(), 0u);  // no keep_caches: nothing kept
    auto kept = make_engine_backend(stories());
    kept->keep_caches(3 * per, co, 5);  // room for 3 of the 5 asked for
    EXPECT_EQ(kept->kept_bytes(), 3 * per);
    // A different request first, run past the window: its cache, used, goes back to the pool.
    run_among(*kept, {1, 300, 42, 77}, SamplerConfig{0.8, 20, 0.95, 99}, co, 0, 90);
    EXPECT_EQ(kept->kept_bytes(), 3 * per);
    {
      auto a = kept->start(prompt, co, sc), b = kept->start(prompt, co, sc);
      EXPECT_EQ(kept->kept_bytes(), 1 * per);  // two taken
    }
    EXPECT_EQ(kept->kept_bytes(), 3 * per);  // both given back
    EXPECT_EQ(run_among(*kept, prompt, sc, co, 0, 60), ref);
    // A request of other settings: made new, and the kept caches it would not fit beside are freed.
    CacheSpec other = co;
    other.storage = KVStorage::F16;
    {
      auto o = kept->start(prompt, other, sc);
      EXPECT_LE(kept->kept_bytes() + kept->reservation_bytes(other), 3 * per);
    }
  }
}

// `serve --device cuda`: a device cache cannot be fed token rows (its append
// fails); the reservation is the device memory it allocated when made. A fake
// device cache through the cache factory (the seam src/cuda uses) checks it on CPU.
class FakeDeviceCache : public DeviceKVCache {
 public:
  FakeDeviceCache(const KVCacheShape& s) : DeviceKVCache(s) {}
  void forward(const int32_t*, int64_t, float*, bool) override {}
  void forward_batch(const int32_t*, int64_t, KVCache* const*, float*) override {}
  void copy_from(const KVCache&) override {}
  size_t device_bytes() const override { return size_t(shape().capacity) * 1000 + 7; }
  int64_t stored(int64_t) const override { return 0; }
  int64_t room() const override { return shape().capacity; }
  size_t payload_bytes() const override { return 0; }
  std::string describe() const override { return "fake device cache"; }
};

TEST(ServeEngineBackend, ReservationOfADeviceCacheIsItsDeviceMemory) {
  const Model& m = *stories().model;
  set_cache_factory([](const KVCacheShape& s, const CacheSpec&) { return std::make_unique<FakeDeviceCache>(s); });
  struct Restore {
    ~Restore() { set_cache_factory(nullptr); }  // also when full_cache_bytes throws
  } restore;
  CacheSpec b;
  b.sink = 4;
  b.window = 60;
  const size_t unbounded = full_cache_bytes(m, CacheSpec{}), bounded = full_cache_bytes(m, b);
  EXPECT_EQ(unbounded, size_t(512) * 1000 + 7);  // stories260K's context
  EXPECT_EQ(bounded, size_t(64) * 1000 + 7);     // sink + window slots
}

}  // namespace
}  // namespace ptllm::serve
