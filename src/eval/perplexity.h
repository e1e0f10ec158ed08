// Perplexity of a model over token streams, by full (batched) forward or fed
// token by token through a KV cache (the decode path `sample` uses), plus the
// bookkeeping the `perplexity` and `compare` commands report.
//
// Conventions: a "prediction" is scoring token t+1 from the logits produced
// after feeding token t. Its *position* is t+1 (the index of the predicted
// token in its stream), so a W-token window has predictions at 1..W-1.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv/cache_spec.h"
#include "model/model.h"

namespace ptllm {
class Tokenizer;
struct LoadedModel;
}  // namespace ptllm

namespace ptllm::eval {

using Ids = std::vector<int32_t>;

// ---- Inputs --------------------------------------------------------------

// Reads a JSON array of arrays of token ids. Every id must lie in [0, vocab).
// Throws Error naming the file on unreadable/malformed input, an empty array,
// an empty inner array, or an id outside the vocabulary.
std::vector<Ids> read_ids_file(const std::string& path, int64_t vocab);

// One stream per file: BOS (if bos >= 0), the file's tokens, EOS (if eos >= 0).
// Throws Error naming the file when it is unreadable or empty.
std::vector<Ids> tokenize_files(const std::vector<std::string>& files, const Tokenizer& tok, int32_t bos,
                                int32_t eos);

// All streams joined end to end.
Ids concatenate(const std::vector<Ids>& streams);

// The files' texts joined end to end (as `cat` joins them) and tokenized once,
// BOS first (if bos >= 0), no EOS: llama-perplexity's input. Throws Error
// naming a file that is unreadable, or when the text encodes to no tokens.
Ids tokenize_joined(const std::vector<std::string>& files, const Tokenizer& tok, int32_t bos);

// llama-perplexity's chunks: consecutive non-overlapping n_ctx-token slices of
// `stream` from its start (a trailing partial one dropped), at most
// `max_chunks` (0 = all), each with its first token replaced by `bos` (when
// bos >= 0). Score them with ScoreOptions::first_scored =
// llama_cpp_first_scored(n_ctx): only the second half is scored.
std::vector<Ids> cut_llama_cpp_chunks(const Ids& stream, int64_t n_ctx, int64_t max_chunks, int32_t bos);
// llama-perplexity scores the logits of chunk tokens n_ctx/2 .. n_ctx-2, i.e.
// (in this file's convention) the predictions at positions n_ctx/2 + 1 ..
// n_ctx - 1: n_ctx - 1 - n_ctx/2 of them per chunk (255 for 512).
inline int64_t llama_cpp_first_scored(int64_t n_ctx) { return n_ctx / 2 + 1; }

// Consecutive non-overlapping `window`-token slices of each stream from its
// start (a trailing partial slice is dropped), at most `max_windows` in all
// (0 = no limit). Throws when window < 2.
std::vector<Ids> cut_windows(const std::vector<Ids>& streams, int64_t window, int64_t max_windows);

// ---- Accumulation --------------------------------------------------------

// Sum of negative log-likelihoods (natural log) and how many predictions;
// in a KL run (RunResult::has_kl) also the sum of KL divergences against the
// reference and how many predictions kept the reference's top-1 token.
struct Tally {
  double nll = 0;
  int64_t count = 0;
  double kl = 0;
  int64_t top1_same = 0;
  void add(double x) {
    nll += x;
    ++count;
  }
  void add_kl(double k, bool same_top1) {
    kl += k;
    top1_same += same_top1 ? 1 : 0;
  }
  void merge(const Tally& o) {
    nll += o.nll;
    count += o.count;
    kl += o.kl;
    top1_same += o.top1_same;
  }
  double mean_nll() const { return count ? nll / double(count) : 0.0; }
  double ppl() const;  // exp(mean NLL); NaN when empty
  double mean_kl() const;         // NaN when empty
  double top1_agreement() const;  // NaN when empty
};

// KL(P_ref || P) of each scored prediction (nats), in scoring order, for
// quantiles. 4 bytes a prediction: a 200,000-token stream keeps 0.8 MB.
struct KlStats {
  std::vector<float> values;
  // q in [0, 1]: the nearest-rank quantile (q = 0.5 median, 0.99 p99, 1 max);
  // NaN when empty.
  double quantile(double q) const;
};

// KL(P || Q) = sum_v p_v (log p_v - log q_v) between softmax(ref_logits) and
// softmax(logits), in double precision, and whether both have the same
// argmax (the first index of the maximum). ref_logits, logits: [vocab].
struct KlPoint {
  double kl;
  bool same_top1;
};
KlPoint kl_divergence(const float* ref_logits, const float* logits, int64_t vocab);

// Stream segments by predicted-token position: [1, 511], [512, 1023],
// [1024, 2047], [2048, 4095], ... (the first 511 predictions fit in a
// 512-token context; every later segment doubles).
struct Segments {
  static int64_t index(int64_t pos);           // pos >= 1
  static int64_t first(int64_t idx);           // first position of segment idx
  static int64_t last(int64_t idx);            // last position of segment idx
  static std::string label(int64_t idx);       // "1–511"
};

// -log softmax(logits)[target], in double precision. logits: [vocab].
double token_nll(const float* logits, int64_t vocab, int32_t target);

// ---- Runs ----------------------------------------------------------------

// Called after each step with the number of tokens just processed.
using ProgressFn = std::function<void(int64_t tokens)>;

struct ScoreOptions {
  ProgressFn progress;
  int64_t bin_size = 128;
  // Predictions at positions < first_scored are fed but not scored (1 = all;
  // llama_cpp_first_scored(n) for llama-perplexity's second half).
  int64_t first_scored = 1;
};

struct RunResult {
  Tally total;
  std::vector<Tally> segments;  // by Segments::index (stream mode; window mode fills it too)
  std::vector<Tally> bins;      // predictions in [i*bin_size, (i+1)*bin_size) (for plots)
  int64_t bin_size = 0;
  int64_t tokens_fed = 0;   // tokens that went through forward()
  double seconds = 0;       // wall time of the forward passes and scoring
  int64_t max_stored = 0;   // most tokens layer 0 of the cache held at once
  size_t max_cache_bytes = 0;  // most K/V payload + scale bytes held at once
  std::string cache;        // the cache's own description
  bool has_kl = false;      // a KL run: Tally::kl/top1_same and kl are filled
  KlStats kl;               // per scored prediction, against the reference
  double tokens_per_second() const { return seconds > 0 ? double(tokens_fed) / seconds : 0; }
};

enum class Path { Full, Cache };
std::string_view path_name(Path p);

// Window mode: each window scored on all W-1 next-token predictions, each on a
// fresh cache built by make_cache(opts).
//  - Path::Full: batched Model::forward(all_logits) over the window (in chunks
//    of the cache's room() if it is bounded) — the prefill path.
//  - Path::Cache: one token per forward(), last-token logits — the decode path.
RunResult score_windows(const Model& model, const std::vector<Ids>& windows, Path path, const CacheSpec& opts,
                        const ScoreOptions& so);
inline RunResult score_windows(const Model& model, const std::vector<Ids>& windows, Path path, const CacheSpec& opts,
                               const ProgressFn& progress = {}, int64_t bin_size = 128) {
  return score_windows(model, windows, path, opts, ScoreOptions{progress, bin_size, 1});
}

// Stream mode: each stream fed token by token through one cache (eviction
// happens inside a bounded cache), every prediction scored.
RunResult score_streams(const Model& model, const std::vector<Ids>& streams, const CacheSpec& opts,
                        const ScoreOptions& so);
inline RunResult score_streams(const Model& model, const std::vector<Ids>& streams, const CacheSpec& opts,
                               const ProgressFn& progress = {}, int64_t bin_size = 128) {
  return score_streams(model, streams, opts, ScoreOptions{progress, bin_size, 1});
}

// KL divergence runs: `reference` and every setting are fed the same inputs
// in lockstep (a fresh cache each per input), and each setting's next-token
// distribution at every scored position is compared with the reference's
// (KL(P_ref || P_setting), top-1 agreement) besides its own perplexity. Only
// one step's logits per cache are alive at a time (decode path, streams), or
// one prefill chunk of at most kKlChunk tokens (full path: each cache is fed
// the window in kKlChunk-token prefills). reference.kl is the reference
// against itself (all 0). A setting equal to the reference still runs on its
// own cache (so KL 0 is a measured fact, not an assumption).
inline constexpr int64_t kKlChunk = 256;
struct KlRun {
  RunResult reference;
  std::vector<RunResult> settings;
};
KlRun score_windows_kl(const Model& model, const std::vector<Ids>& windows, Path path, const CacheSpec& reference,
                       const std::vector<CacheSpec>& settings, const ScoreOptions& so = {});
KlRun score_streams_kl(const Model& model, const std::vector<Ids>& streams, const CacheSpec& reference,
                       const std::vector<CacheSpec>& settings, const ScoreOptions& so = {});

// The fp32 cache a setting is measured against: the same spec (eviction,
// sink, window, RoPE mode) with K and V stored in fp32, canonical.
CacheSpec kl_reference(const CacheSpec& setting);

// Tokens of `prompt` then up to n greedily decoded ids through Session (the
// `sample` path, EOS ignored so every setting yields n tokens).
Ids greedy_continuation(const LoadedModel& lm, const Ids& prompt, int64_t n, const CacheSpec& opts);

// Leading ids that a and b share.
int64_t common_prefix(const Ids& a, const Ids& b);

// `compare`: n greedy tokens per prompt under each setting against the plain
// fp32 cache. progress() is told n after each continuation.
struct GreedyMatch {
  std::vector<Ids> reference;                // [prompt] fp32-cache continuation
  std::vector<std::vector<Ids>> outputs;     // [setting][prompt]
  std::vector<std::vector<int64_t>> match;   // [prompt][setting] leading tokens equal to the reference
  std::vector<double> mean_fraction;         // [setting] mean over prompts of match / reference length
};
GreedyMatch compare_greedy(const LoadedModel& lm, const std::vector<Ids>& prompts,
                           const std::vector<CacheSpec>& settings, int64_t n, const ProgressFn& progress = {});

}  // namespace ptllm::eval
