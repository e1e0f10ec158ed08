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

Ids tokenize_joined(const std::vector<std::string>& files, const Tokenizer& tok, int32_t bos) {
  if (files.empty()) fail("no input files (give text files)");
  std::string text;
  for (const auto& path : files) text += read_text_file(path);  // throws naming the path
  if (text.empty()) fail("{}: the input is empty (nothing to score)", files.size() == 1 ? files[0] : "the files");
  Ids ids;
  if (bos >= 0) ids.push_back(bos);
  const Ids body = tok.encode(text, /*add_special_tokens=*/false);
  if (body.empty()) fail("the input encodes to no tokens");
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::vector<Ids> cut_llama_cpp_chunks(const Ids& stream, int64_t n_ctx, int64_t max_chunks, int32_t bos) {
  if (n_ctx < 4) fail("--window {}: expected >= 4 for --llama-cpp (half of each chunk is context)", n_ctx);
  std::vector<Ids> chunks = cut_windows({stream}, n_ctx, max_chunks);
  if (bos >= 0)
    for (Ids& c : chunks) c[0] = bos;
  return chunks;
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
double Tally::mean_kl() const { return count ? kl / double(count) : std::numeric_limits<double>::quiet_NaN(); }
double Tally::top1_agreement() const {
  return count ? double(top1_same) / double(count) : std::numeric_limits<double>::quiet_NaN();
}

double KlStats::quantile(double q) const {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::vector<float> v = values;
  // Nearest rank: the smallest value with at least q of the values <= it.
  const auto n = int64_t(v.size());
  int64_t k = int64_t(std::ceil(std::clamp(q, 0.0, 1.0) * double(n))) - 1;
  k = std::clamp<int64_t>(k, 0, n - 1);
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return double(v[size_t(k)]);
}

namespace {
// log sum_v exp(l_v) and the first argmax, in double.
struct Lse {
  double lse;
  int64_t argmax;
};
Lse log_sum_exp(const float* l, int64_t vocab) {
  int64_t am = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (l[i] > l[am]) am = i;
  const double mx = l[am];
  if (!std::isfinite(mx)) fail("logits are not finite (max {})", mx);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(l[i]) - mx);
  return {mx + std::log(sum), am};
}
// KL(P || Q) given P's log-sum-exp already computed.
KlPoint kl_from(const float* ref, const Lse& r, const float* l, int64_t vocab) {
  const Lse q = log_sum_exp(l, vocab);
  double kl = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double lp = double(ref[i]) - r.lse;
    kl += std::exp(lp) * (lp - (double(l[i]) - q.lse));
  }
  // Rounding can leave a tiny negative sum for nearly equal distributions.
  return {std::max(kl, 0.0), r.argmax == q.argmax};
}
}  // namespace

KlPoint kl_divergence(const float* ref_logits, const float* logits, int64_t vocab) {
  return kl_from(ref_logits, log_sum_exp(ref_logits, vocab), logits, vocab);
}

CacheSpec kl_reference(const CacheSpec& setting) {
  CacheSpec r = setting;
  r.storage = KVStorage::F32;
  r.key_storage.reset();
  r.value_storage.reset();
  r.rotate = KVRotate::None;  // the reference is the plain fp32 cache
  return r.canonical();
}

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

// Records one prediction at stream position `pos` (and its KL against the
// reference when kl is given).
void record(RunResult& r, int64_t pos, double nll, const KlPoint* kl = nullptr) {
  const auto seg = size_t(Segments::index(pos));
  if (r.segments.size() <= seg) r.segments.resize(seg + 1);
  const auto bin = size_t(pos / r.bin_size);
  if (r.bins.size() <= bin) r.bins.resize(bin + 1);
  for (Tally* t : {&r.total, &r.segments[seg], &r.bins[bin]}) {
    t->add(nll);
    if (kl) t->add_kl(kl->kl, kl->same_top1);
  }
  if (kl) r.kl.values.push_back(float(kl->kl));
}

void note_cache(RunResult& r, const KVCache& c) {
  r.max_stored = std::max(r.max_stored, c.stored(0));
  r.max_cache_bytes = std::max(r.max_cache_bytes, c.payload_bytes() + c.scale_bytes());
}

// The decode path: token t of `ids` through the cache, scoring token t + 1.
void score_step(RunResult& r, Decoder& d, const Ids& ids, int64_t t, const ScoreOptions& so) {
  const std::vector<float>& logits = d.step(ids[size_t(t)]);
  note_cache(r, d.cache());
  if (t + 1 >= so.first_scored)
    record(r, t + 1, token_nll(logits.data(), int64_t(logits.size()), ids[size_t(t + 1)]));
  ++r.tokens_fed;
  if (so.progress) so.progress(1);
}

void check_ids(const Ids& ids, int64_t vocab) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) fail("token id {} is outside the vocabulary (0..{})", id, vocab - 1);
}

// Each input (>= 2 tokens, ids in the vocabulary) on a fresh cache sized for
// it (a bounded one sizes itself); score(r, decoder, ids) feeds and scores it.
void check_inputs(const std::vector<Ids>& inputs, const ScoreOptions& so, const char* kind) {
  if (inputs.empty()) fail("no {} to score{}", kind, std::string_view(kind) == "window" ? " (the input is shorter than one window)" : "");
  if (so.bin_size < 1) fail("bin size {}: expected >= 1", so.bin_size);
  if (so.first_scored < 1) fail("first scored position {}: expected >= 1", so.first_scored);
}

template <typename Score>
RunResult score_each(const Model& model, const std::vector<Ids>& inputs, const CacheSpec& opts,
                     const ScoreOptions& so, const char* kind, Score&& score) {
  check_inputs(inputs, so, kind);
  RunResult r;
  r.bin_size = so.bin_size;
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
                        const ScoreOptions& so) {
  const int64_t V = model.config().vocab_size;
  return score_each(model, windows, opts, so, "window", [&](RunResult& r, Decoder& d, const Ids& w) {
    const int64_t W = int64_t(w.size());
    if (path == Path::Cache) {
      for (int64_t t = 0; t + 1 < W; ++t) score_step(r, d, w, t, so);
      return;
    }
    // Batched prefill with every token's logits (in chunks of the cache's room() if it is bounded).
    d.prefill(std::span(w.data(), size_t(W - 1)), [&](int64_t first, int64_t n, const float* logits) {
      note_cache(r, d.cache());
      for (int64_t i = 0; i < n; ++i)
        if (first + i + 1 >= so.first_scored)
          record(r, first + i + 1, token_nll(logits + i * V, V, w[size_t(first + i + 1)]));
      r.tokens_fed += n;
      if (so.progress) so.progress(n);
    });
  });
}

RunResult score_streams(const Model& model, const std::vector<Ids>& streams, const CacheSpec& opts,
                        const ScoreOptions& so) {
  return score_each(model, streams, opts, so, "stream", [&](RunResult& r, Decoder& d, const Ids& s) {
    for (int64_t t = 0; t + 1 < int64_t(s.size()); ++t) score_step(r, d, s, t, so);
  });
}

namespace {

// The lockstep engine of score_windows_kl / score_streams_kl. For each input:
// a fresh cache for the reference and for every setting; the reference is fed
// a piece (one token, or a prefill chunk of <= kKlChunk tokens), its logits
// kept ([n, V] floats), then every setting is fed the same piece and each of
// its predictions compared with the reference's at the same position.
KlRun score_kl(const Model& model, const std::vector<Ids>& inputs, bool full, const CacheSpec& reference,
               const std::vector<CacheSpec>& settings, const ScoreOptions& so, const char* kind) {
  check_inputs(inputs, so, kind);
  const int64_t V = model.config().vocab_size;
  const size_t S = settings.size();
  KlRun out;
  out.settings.resize(S);
  std::vector<RunResult*> runs = {&out.reference};
  for (auto& r : out.settings) runs.push_back(&r);
  for (RunResult* r : runs) {
    r->bin_size = so.bin_size;
    r->has_kl = true;
  }
  std::vector<float> ref_logits;  // [piece, V]
  std::vector<Lse> ref_lse;       // [piece]
  for (const Ids& ids : inputs) {
    if (ids.size() < 2) fail("{} of {} tokens: expected >= 2", kind, ids.size());
    check_ids(ids, V);
    const auto shape = model.cache_shape(int64_t(ids.size()));
    std::vector<std::unique_ptr<Decoder>> dec;
    dec.push_back(std::make_unique<Decoder>(model, make_cache(shape, reference)));
    for (const CacheSpec& s : settings) dec.push_back(std::make_unique<Decoder>(model, make_cache(shape, s)));
    for (size_t i = 0; i < dec.size(); ++i)
      if (runs[i]->cache.empty()) runs[i]->cache = dec[i]->cache().describe();
    const int64_t n_pred = int64_t(ids.size()) - 1;  // tokens fed: all but the last
    const int64_t piece = full ? kKlChunk : 1;
    for (int64_t off = 0; off < n_pred; off += piece) {
      const int64_t n = std::min(piece, n_pred - off);
      ref_logits.resize(size_t(n * V));
      ref_lse.resize(size_t(n));
      // Feeds tokens [off, off + n) to decoder i; score(j, logits) for each fed token off + j.
      auto feed = [&](size_t i, const auto& score) {
        Decoder& d = *dec[i];
        const auto t0 = clock::now();
        if (full) {
          d.prefill(std::span(ids.data() + off, size_t(n)), [&](int64_t first, int64_t m, const float* logits) {
            note_cache(*runs[i], d.cache());
            for (int64_t j = 0; j < m; ++j) score(first + j, logits + j * V);
          });
        } else {
          const std::vector<float>& logits = d.step(ids[size_t(off)]);
          note_cache(*runs[i], d.cache());
          score(0, logits.data());
        }
        runs[i]->seconds += since(t0);
        runs[i]->tokens_fed += n;
      };
      feed(0, [&](int64_t j, const float* l) {
        std::copy_n(l, V, ref_logits.data() + j * V);
        ref_lse[size_t(j)] = log_sum_exp(l, V);
      });
      for (size_t i = 0; i < dec.size(); ++i) {
        auto score = [&](int64_t j, const float* l) {
          const int64_t pos = off + j + 1;  // the predicted token's position
          if (pos < so.first_scored) return;
          const float* ref = ref_logits.data() + j * V;
          const KlPoint k = kl_from(ref, ref_lse[size_t(j)], l, V);
          record(*runs[i], pos, token_nll(l, V, ids[size_t(pos)]), &k);
        };
        if (i == 0) {
          for (int64_t j = 0; j < n; ++j) score(j, ref_logits.data() + j * V);  // the reference against itself
        } else {
          feed(i, score);
        }
      }
      if (so.progress) so.progress(n);
    }
  }
  return out;
}

}  // namespace

KlRun score_windows_kl(const Model& model, const std::vector<Ids>& windows, Path path, const CacheSpec& reference,
                       const std::vector<CacheSpec>& settings, const ScoreOptions& so) {
  return score_kl(model, windows, path == Path::Full, reference, settings, so, "window");
}

KlRun score_streams_kl(const Model& model, const std::vector<Ids>& streams, const CacheSpec& reference,
                       const std::vector<CacheSpec>& settings, const ScoreOptions& so) {
  return score_kl(model, streams, false, reference, settings, so, "stream");
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
