// `cache-table`: KV cache bytes per storage mode and length, measured from
// real cache objects (each is filled with T tokens and asked for its byte
// count). The closed-form formula is in docs/CACHE.md; tests/kv checks that
// the two agree.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "kv/cache_options.h"

namespace ptllm::cli {
namespace {

std::string grouped(size_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

struct Bytes {
  size_t payload = 0, scales = 0;
};

// Builds a cache for T tokens in `storage` and appends T tokens of
// deterministic pseudo-random K/V to every layer.
Bytes measure(const Model& m, KVStorage storage, int64_t T) {
  CacheOptions o;
  o.storage = storage;
  auto cache = make_cache(m.cache_shape(T), o);
  const auto& s = cache->shape();
  std::vector<float> k(size_t(T * s.n_kv_heads * s.head_dim)), v(k.size());
  uint32_t x = 12345;
  for (size_t i = 0; i < k.size(); ++i) {
    x = x * 1664525u + 1013904223u;
    k[i] = float(int(x >> 16) % 2001 - 1000) / 250.f;
    v[i] = -0.5f * k[i];
  }
  for (int64_t l = 0; l < s.n_layers; ++l) cache->append(l, k.data(), v.data(), T);
  cache->advance(T);
  return {cache->payload_bytes(), cache->scale_bytes()};
}

}  // namespace

void add_cache_table_command(CLI::App& root) {
  struct Opts {
    std::string model, lengths = "128,256,384,500,1024,2048";
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("cache-table", "KV cache bytes per --kv-quantize mode, measured from cache objects");
  cmd->add_option("model", o->model, "Model folder or .tinygpt (default: the bundled flagship-27m)");
  cmd->add_option("--lengths", o->lengths, "Comma-separated token counts (default 128,256,384,500,1024,2048)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  cmd->callback([o] {
    std::vector<int64_t> lengths;
    for (int32_t t : parse_id_list(o->lengths, "--lengths")) {
      if (t < 1) fail("--lengths {}: expected token counts >= 1", o->lengths);
      lengths.push_back(t);
    }
    const std::string path = o->model.empty() ? default_model_path() : o->model;
    LoadedModel lm = load_model(path);
    const auto shape = lm.model->cache_shape(1);
    nlohmann::json j;
    j["model"] = path;
    j["layers"] = shape.n_layers;
    j["kv_heads"] = shape.n_kv_heads;
    j["head_dim"] = shape.head_dim;
    if (!o->json) {
      fmt::print("KV cache bytes, {}: {} cache layers x {} KV heads x head_dim {} (measured from cache objects)\n",
                 path, shape.n_layers, shape.n_kv_heads, shape.head_dim);
      fmt::print("{:>7}", "tokens");
      for (KVStorage s : kAllStorages) fmt::print("  {:>26}", storage_name(s));
      fmt::print("\n");
    }
    for (int64_t T : lengths) {
      if (!o->json) fmt::print("{:>7}", T);
      nlohmann::json row;
      row["tokens"] = T;
      for (KVStorage s : kAllStorages) {
        const Bytes b = measure(*lm.model, s, T);
        row[std::string(storage_name(s))] = {{"payload", b.payload}, {"scales", b.scales}, {"total", b.payload + b.scales}};
        if (!o->json) {
          std::string cell = grouped(b.payload);
          if (b.scales) cell += " + " + grouped(b.scales) + " sc";
          fmt::print("  {:>26}", cell);
        }
      }
      if (!o->json) fmt::print("\n");
      j["rows"].push_back(row);
    }
    if (o->json)
      fmt::print("{}\n", j.dump(2));
    else
      fmt::print("(\"+ N sc\": fp16 scale+zero bytes of KIVI; formula in docs/CACHE.md)\n");
  });
}

}  // namespace ptllm::cli
