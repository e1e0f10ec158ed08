// Shared test helpers: fixture locations and JSON loading.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace ptllm::test {

inline std::string shared_dir() { return PTLLM_SHARED_DIR; }
inline std::string repo_dir() { return PTLLM_REPO_DIR; }
inline std::string fixture(const std::string& rel) { return shared_dir() + "/fixtures/" + rel; }

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

}  // namespace ptllm::test
