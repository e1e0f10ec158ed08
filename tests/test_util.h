// Shared test helpers: fixture locations, JSON loading, running the CLI.
#pragma once
#include <sys/wait.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/session.h"
#include "kv/cache_spec.h"
#include "ops/ops.h"
#include "randn.h"

namespace ptllm::test {

inline std::string shared_dir() { return PTLLM_SHARED_DIR; }
inline std::string repo_dir() { return PTLLM_REPO_DIR; }
inline std::string fixture(const std::string& rel) { return shared_dir() + "/fixtures/" + rel; }

// Restores the SIMD level when a test that switches levels ends.
struct SimdGuard {
  ops::SimdLevel saved = ops::simd_level();
  ~SimdGuard() { ops::set_simd_level(saved); }
};

// The Error message of fn(), "" when it does not throw.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// `name` in this test process's own temporary folder, which is removed when
// the process ends (the GGUF files some tests write are tens of MB).
inline std::string tmp_path(const std::string& name) {
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("ptllm_test_" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return (dir.path / name).string();
}

// A file's bytes ("" when it cannot be read) and writing them back.
inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

// A cache spec from its storage, StreamingLLM bound, RoPE mode and KIVI group/residual.
inline CacheSpec cache_spec(KVStorage s, int64_t sink = 0, int64_t window = 0, RopeMode r = RopeMode::Reposition,
                            int64_t group = CacheSpec{}.kivi_group, int64_t residual = CacheSpec{}.kivi_residual) {
  CacheSpec o;
  o.storage = s;
  o.kivi_group = group;
  o.kivi_residual = residual;
  o.sink = sink;
  o.window = window;
  o.rope_mode = r;
  return o;
}

// n greedy tokens after `prompt` through a fresh default (fp32, unbounded)
// cache sized for prompt + n, EOS ignored: the decode every reference
// comparison of greedy continuations starts from.
inline std::vector<int32_t> greedy_tokens(const LoadedModel& lm, const std::vector<int32_t>& prompt, size_t n) {
  Session s(lm, make_default_cache(*lm.model, int64_t(prompt.size() + n)));
  GenerateOptions go;
  go.max_new_tokens = int64_t(n);
  go.ignore_eos = true;
  std::vector<int32_t> got;
  s.generate(prompt, go, [&](int32_t id) {
    got.push_back(id);
    return true;
  });
  return got;
}

struct CliResult {
  int status;       // exit status, or 128 + signal
  std::string out;  // what the command printed on stdout
};

// Runs `posttrainllm <args>` through the shell (args may redirect: "2>&1").
inline CliResult run_cli(const std::string& args) {
  const std::string cmd = std::string(PTLLM_CLI) + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {127, "popen failed: " + cmd};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

}  // namespace ptllm::test
