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

// Consecutive non-overlapping `window`-token slices of each stream from its
// start (a trailing partial slice is dropped), at most `max_windows` in all
// (0 = no limit). Throws when window < 2.
std::vector<Ids> cut_windows(const std::vector<Ids>& streams, int64_t window, int64_t max_windows);

// ---- Accumulation --------------------------------------------------------

// Sum of negative log-likelihoods (natural log) and how many predictions.
struct Tally {
  double nll = 0;
  int64_t count = 0;
  void add(double x) {
    nll += x;
    ++count;
  }
  void merge(const Tally& o) {
    nll += o.nll;
    count += o.count;
  }
  double mean_nll() const { return count ? nll / double(count) : 0.0; }
  double ppl() const;  // exp(mean NLL); NaN when empty
};

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
                        const ProgressFn& progress = {}, int64_t bin_size = 128);

// Stream mode: each stream fed token by token through one cache (eviction
// happens inside a bounded cache), every prediction scored.
RunResult score_streams(const Model& model, const std::vector<Ids>& streams, const CacheSpec& opts,
                        const ProgressFn& progress = {}, int64_t bin_size = 128);

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
