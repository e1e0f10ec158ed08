// Tokenizer benchmarks: tokenizer.json load time and single-thread encode /
// decode throughput on English prose (shared/corpus/heldout).
//
//   ./tokenizer_bench --benchmark_filter=. --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace {

const std::string kShared = PTLLM_SHARED_DIR;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The four held-out books, concatenated in file-name order (~3 MB of prose).
const std::string& heldout() {
  static const std::string text = [] {
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(kShared + "/corpus/heldout"))
      if (e.path().extension() == ".txt") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    std::string all;
    for (const auto& f : files) all += read_all(f);
    return all;
  }();
  return text;
}

const ptllm::Tokenizer& cached(const std::string& path) {
  static std::map<std::string, ptllm::Tokenizer> m;
  auto it = m.find(path);
  if (it == m.end()) it = m.emplace(path, ptllm::Tokenizer::from_file(path)).first;
  return it->second;
}

std::string fixture(const char* name) { return kShared + "/fixtures/tokenizers/" + name + "/tokenizer.json"; }
std::string flagship() { return kShared + "/models/flagship-27m/tokenizer.json"; }

void BM_Load(benchmark::State& state, std::string path) {
  for (auto _ : state) {
    ptllm::Tokenizer t = ptllm::Tokenizer::from_file(path);
    benchmark::DoNotOptimize(t.vocab_size());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(std::filesystem::file_size(path)));
}
BENCHMARK_CAPTURE(BM_Load, qwen3_11MB, fixture("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Load, llama3_9MB, fixture("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Load, llama2_flagship, flagship())->Unit(benchmark::kMillisecond);

void BM_Encode(benchmark::State& state, std::string path) {
  const ptllm::Tokenizer& t = cached(path);
  const std::string& text = heldout();
  size_t n = 0;
  for (auto _ : state) {
    auto ids = t.encode(text, false);
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens"] = double(n);
  state.counters["tokens/s"] = benchmark::Counter(double(n) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_Encode, llama3, fixture("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, qwen3, fixture("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, gpt2, fixture("gpt2"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama2_flagship, flagship())->Unit(benchmark::kMillisecond);

// Short prompts: per-call overhead matters for chat-style use.
void BM_EncodeShort(benchmark::State& state, std::string path) {
  const ptllm::Tokenizer& t = cached(path);
  const std::string text = heldout().substr(10000, 200);
  for (auto _ : state) benchmark::DoNotOptimize(t.encode(text, true));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK_CAPTURE(BM_EncodeShort, llama3_200B, fixture("llama3"));

void BM_Decode(benchmark::State& state, std::string path) {
  const ptllm::Tokenizer& t = cached(path);
  const std::string text = heldout().substr(0, 200000);
  const auto ids = t.encode(text, false);
  for (auto _ : state) benchmark::DoNotOptimize(t.decode(ids));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}
BENCHMARK_CAPTURE(BM_Decode, llama3, fixture("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, llama2_flagship, flagship())->Unit(benchmark::kMillisecond);

void BM_StreamDecode(benchmark::State& state, std::string path) {
  const ptllm::Tokenizer& t = cached(path);
  const std::string text = heldout().substr(0, 50000);
  const auto ids = t.encode(text, false);
  for (auto _ : state) {
    ptllm::StreamDecoder sd(t);
    size_t n = 0;
    for (int32_t id : ids) n += sd.push(id).size();
    n += sd.flush().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens/s"] = benchmark::Counter(double(ids.size()) * double(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_StreamDecode, llama3, fixture("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamDecode, llama2_flagship, flagship())->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
