// Test helper: writes a vocabulary-only GGUF from a tokenizer.json with
// write_gguf_tokenizer (what `convert` does), optionally forcing
// tokenizer.ggml.pre, so llama.cpp can be run on it (vocab_anchor_converted.sh).
//   write_vocab_gguf TOKENIZER_JSON CONFIG_JSON|- OUT.gguf ARCH [PRE]
#include <fmt/core.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/gguf.h"
#include "tokenizer/gguf_file.h"

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) ptllm::fail("{}: cannot open", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6) {
    fmt::print(stderr, "usage: write_vocab_gguf TOKENIZER_JSON CONFIG_JSON|- OUT.gguf ARCH [PRE]\n");
    return 2;
  }
  try {
    ptllm::GgufWriter w;
    w.set_string("general.architecture", argv[4]);
    w.set_string("general.name", "vocab-anchor");
    const std::string cfg = std::string(argv[2]) == "-" ? "" : slurp(argv[2]);
    ptllm::write_gguf_tokenizer(slurp(argv[1]), cfg, w);
    if (argc == 6) w.set_string("tokenizer.ggml.pre", argv[5]);
    w.write(argv[3]);
  } catch (const ptllm::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
