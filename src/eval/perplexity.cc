#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/session.h"
#include "io/mmap.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::eval {

namespace {
using clock = std::chrono::steady_clock;
double since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }
}  // namespace

std::vector<Ids> read_ids_file(const std::string& path, int64_t vocab) {
  std::ifstream f(path);
  if (!f) fail("{}: cannot open the ids file", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: expected a JSON array of arrays of token ids ({})", path, e.what());
  }
  if (!j.is_array() || j.empty()) fail("{}: expected a non-empty JSON array of arrays of token ids", path);
  std::vector<Ids> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& a = j[i];
    if (!a.is_array() || a.empty()) fail("{}: entry {} is not a non-empty array of token ids", path, i);
    Ids ids;
    ids.reserve(a.size());
    for (size_t k = 0; k < a.size(); ++k) {
      const auto& v = a[k];
      if (!v.is_number_integer()) fail("{}: entry {}[{}] is not an integer token id", path, i, k);
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= vocab)
        fail("{}: entry {}[{}] = {} is outside the vocabulary (0..{})", path, i, k, id, vocab - 1);
      ids.push_back(int32_t(id));
    }
    out.push_back(std::move(ids));
  }
  return out;
}

std::vector<Ids> tokenize_files(const std::vector<std::string>& files, const Tokenizer& tok, int32_t bos,
                                int32_t eos) {
  if (files.empty()) fail("no input files (give text files or --ids-file)");
  std::vector<Ids> out;
  for (const auto& path : files) {
    const std::string text = read_text_file(path);  // throws naming the path
    if (text.empty()) fail("{}: the file is empty (nothing to score)", path);
    Ids ids;
    if (bos >= 0) ids.push_back(bos);
    const Ids body = tok.encode(text, /*add_special_tokens=*/false);
    if (body.empty()) fail("{}: the file encodes to no tokens", path);
    ids.insert(ids.end(), body.begin(), body.end());
    if (eos >= 0) ids.push_back(eos);
    out.push_back(std::move(ids));
  }
  return out;
}

Ids concatenate(const std::vector<Ids>& streams) {
  Ids out;
  for (const auto& s : streams) out.insert(out.end(), s.begin(), s.end());
  return out;
}

std::vector<Ids> cut_windows(const std::vector<Ids>& streams, int64_t window, int64_t max_windows) {
  if (window < 2) fail("--window {}: expected >= 2 (a window needs a token to predict from and one to predict)", window);
  if (max_windows < 0) fail("--max-windows {}: expected >= 0 (0 = all)", max_windows);
  std::vector<Ids> out;
  for (const auto& s : streams) {
    for (size_t off = 0; off + size_t(window) <= s.size(); off += size_t(window)) {
      if (max_windows > 0 && int64_t(out.size()) >= max_windows) return out;
      out.emplace_back(s.begin() + int64_t(off), s.begin() + int64_t(off) + window);
    }
  }
  return out;
}

double Tally::ppl() const { return count ? std::exp(nll / double(count)) : std::numeric_limits<double>::quiet_NaN(); }

int64_t Segments::index(int64_t pos) {
  if (pos < 512) return 0;
  int64_t idx = 1;
  for (int64_t lo = 1024; pos >= lo; lo *= 2) ++idx;
  return idx;
}
int64_t Segments::first(int64_t idx) { return idx == 0 ? 1 : int64_t(512) << (idx - 1); }
int64_t Segments::last(int64_t idx) { return (int64_t(512) << idx) - 1; }
std::string Segments::label(int64_t idx) { return fmt::format("{}–{}", first(idx), last(idx)); }

double token_nll(const float* logits, int64_t vocab, int32_t target) {
  if (target < 0 || target >= vocab) fail("token id {} is outside the vocabulary (0..{})", target, vocab - 1);
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, logits[i]);
  if (!std::isfinite(mx)) fail("logits are not finite (max {}) while scoring token {}", mx, target);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - double(mx));
  return std::log(sum) + double(mx) - double(logits[target]);
}

std::string_view path_name(Path p) { return p == Path::Full ? "full forward" : "through cache"; }

namespace {

// Records one prediction at stream position `pos`.
void record(RunResult& r, int64_t pos, double nll) {
  r.total.add(nll);
  const auto seg = size_t(Segments::index(pos));
  if (r.segments.size() <= seg) r.segments.resize(seg + 1);
  r.segments[seg].add(nll);
  const auto bin = size_t(pos / r.bin_size);
  if (r.bins.size() <= bin) r.bins.resize(bin + 1);
  r.bins[bin].add(nll);
}

void note_cache(RunResult& r, const KVCache& c) {
  r.max_stored = std::max(r.max_stored, c.stored(0));
  r.max_cache_bytes = std::max(r.max_cache_bytes, c.payload_bytes() + c.scale_bytes());
}

// The decode path: token t of `ids` through the cache, scoring token t + 1.
void score_step(RunResult& r, Decoder& d, const Ids& ids, int64_t t, const ProgressFn& progress) {
  const std::vector<float>& logits = d.step(ids[size_t(t)]);
  note_cache(r, d.cache());
  record(r, t + 1, token_nll(logits.data(), int64_t(logits.size()), ids[size_t(t + 1)]));
  ++r.tokens_fed;
  if (progress) progress(1);
}

void check_ids(const Ids& ids, int64_t vocab) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail("token id {} is outside the vocabulary (0..{})", id, vocab - 1);
}

// Each input (>= 2 tokens, ids in the vocabulary) on a fresh cache sized for
// it (a bounded one sizes itself); score(r, decoder, ids) feeds and scores it.
template <typename Score>
RunResult score_each(const Model& model, const std::vector<Ids>& inputs, const CacheSpec& opts, int64_t bin_size,
                     const char* kind, Score&& score) {
  if (inputs.empty()) fail("no {} to score{}", kind, std::string_view(kind) == "window" ? " (the input is shorter than one window)" : "");
  if (bin_size < 1) fail("bin size {}: expected >= 1", bin_size);
  RunResult r;
  r.bin_size = bin_size;
  const auto t0 = clock::now();
  for (const Ids& ids : inputs) {
    if (ids.size() < 2) fail("{} of {} tokens: expected >= 2", kind, ids.size());
    check_ids(ids, model.config().vocab_size);
    Decoder d(model, make_cache(model.cache_shape(int64_t(ids.size())), opts));
    if (r.cache.empty()) r.cache = d.cache().describe();
    score(r, d, ids);
  }
  r.seconds = since(t0);
  return r;
}

}  // namespace

RunResult score_windows(const Model& model, const std::vector<Ids>& windows, Path path, const CacheSpec& opts,
                        const ProgressFn& progress, int64_t bin_size) {
  const int64_t V = model.config().vocab_size;
  return score_each(model, windows, opts, bin_size, "window", [&](RunResult& r, Decoder& d, const Ids& w) {
    const int64_t W = int64_t(w.size());
    if (path == Path::Cache) {
      for (int64_t t = 0; t + 1 < W; ++t) score_step(r, d, w, t, progress);
      return;
    }
    // Batched prefill with every token's logits (in chunks of the cache's room() if it is bounded).
    d.prefill(std::span(w.data(), size_t(W - 1)), [&](int64_t first, int64_t n, const float* logits) {
      note_cache(r, d.cache());
      for (int64_t i = 0; i < n; ++i) record(r, first + i + 1, token_nll(logits + i * V, V, w[size_t(first + i + 1)]));
      r.tokens_fed += n;
      if (progress) progress(n);
    });
  });
}

RunResult score_streams(const Model& model, const std::vector<Ids>& streams, const CacheSpec& opts,
                        const ProgressFn& progress, int64_t bin_size) {
  return score_each(model, streams, opts, bin_size, "stream", [&](RunResult& r, Decoder& d, const Ids& s) {
    for (int64_t t = 0; t + 1 < int64_t(s.size()); ++t) score_step(r, d, s, t, progress);
  });
}

Ids greedy_continuation(const LoadedModel& lm, const Ids& prompt, int64_t n, const CacheSpec& opts) {
  const Model& m = *lm.model;
  const int64_t need = int64_t(prompt.size()) + n;
  auto cache = make_cache(m.cache_shape(std::min<int64_t>(need, m.config().max_position)), opts);
  Session session(lm, std::move(cache));
  GenerateOptions go;
  go.max_new_tokens = n;
  go.ignore_eos = true;
  go.sampler.temperature = 0;  // greedy
  Ids out;
  session.generate(prompt, go, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  return out;
}

int64_t common_prefix(const Ids& a, const Ids& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return int64_t(i);
}

GreedyMatch compare_greedy(const LoadedModel& lm, const std::vector<Ids>& prompts,
                           const std::vector<CacheSpec>& settings, int64_t n, const ProgressFn& progress) {
  if (n < 1) fail("--tokens {}: expected >= 1", n);
  GreedyMatch g;
  for (const Ids& p : prompts) {
    g.reference.push_back(greedy_continuation(lm, p, n, CacheSpec{}));
    if (progress) progress(n);
  }
  g.outputs.resize(settings.size());
  g.match.assign(prompts.size(), std::vector<int64_t>(settings.size()));
  g.mean_fraction.assign(settings.size(), 0.0);
  for (size_t s = 0; s < settings.size(); ++s) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      g.outputs[s].push_back(greedy_continuation(lm, prompts[i], n, settings[s]));
      g.match[i][s] = common_prefix(g.outputs[s].back(), g.reference[i]);
      const auto len = double(g.reference[i].size());
      g.mean_fraction[s] += len > 0 ? double(g.match[i][s]) / len : 1.0;
      if (progress) progress(n);
    }
    g.mean_fraction[s] /= double(std::max<size_t>(prompts.size(), 1));
  }
  return g;
}

}  // namespace ptllm::eval
