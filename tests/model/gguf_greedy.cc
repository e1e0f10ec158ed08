// Not a test: prints our greedy continuation of token ids for any model path
// (folder, .tinygpt, .gguf), comma-separated, the counterpart of
// scripts/llamacpp_greedy.mjs for scripts/gguf_anchor.sh.
//   gguf_greedy MODEL 1,2,3 N
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "engine/session.h"

int main(int argc, char** argv) {
  using namespace ptllm;
  if (argc != 4) {
    std::fprintf(stderr, "usage: gguf_greedy MODEL IDS N\n");
    return 2;
  }
  try {
    LoadedModel lm = load_model(argv[1]);
    std::vector<int32_t> prompt;
    std::stringstream ss(argv[2]);
    for (std::string t; std::getline(ss, t, ',');) prompt.push_back(int32_t(std::stol(t)));
    const int n = std::atoi(argv[3]);
    const Model& m = *lm.model;
    auto cache = make_default_cache(m, int64_t(prompt.size()) + n);
    std::vector<float> logits(size_t(m.config().vocab_size));
    m.forward(prompt.data(), int64_t(prompt.size()), *cache, logits.data(), false);
    for (int i = 0; i < n; ++i) {
      const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      std::printf(i ? ",%d" : "%d", id);
      m.forward(&id, 1, *cache, logits.data(), false);
    }
    std::printf("\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
