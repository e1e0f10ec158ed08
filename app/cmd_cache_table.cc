// `cache-table`: KV cache bytes per storage mode and length (with the KIVI
// group/residual and K/V overrides of --kivi-group, --kivi-residual,
// --kv-quantize-k, --kv-quantize-v), measured from real cache objects (each is
// filled with T tokens and asked for its byte count). The closed-form formula
// is in docs/CACHE.md; tests/kv checks that the two agree.
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "app/cache_flags.h"
#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "eval/sweep.h"
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

// Builds a cache for T tokens with options `o` and appends T tokens of
// deterministic pseudo-random K/V to every layer.
Bytes measure(const Model& m, const CacheOptions& o, int64_t T) {
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
    CacheOptions cache;  // --kv-quantize-k/-v, --kivi-group, --kivi-residual; storage set per column
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("cache-table", "KV cache bytes per --kv-quantize mode, measured from cache objects");
  cmd->add_option("model", o->model, "Model folder or .tinygpt (default: the bundled flagship-27m)");
  cmd->add_option("--lengths", o->lengths, "Comma-separated token counts (default 128,256,384,500,1024,2048)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of the table");
  add_kivi_flags(cmd, o->cache);
  cmd->footer(
      "One column per --kv-quantize mode. --kivi-group/--kivi-residual apply to the int8/int4/int2 columns "
      "(--kivi-group 0: the simple scheme); --kv-quantize-k/--kv-quantize-v fix K or V in every column (columns "
      "that give the same cache are shown once).");
  cmd->callback([o] {
    validate(o->cache);  // --kivi-residual must be a multiple of --kivi-group
    std::vector<int64_t> lengths;
    for (int32_t t : parse_id_list(o->lengths, "--lengths")) {
      if (t < 1) fail("--lengths {}: expected token counts >= 1", o->lengths);
      lengths.push_back(t);
    }
    // Columns: one per storage mode, with the K/V overrides and KIVI parameters applied; same cache once.
    std::vector<CacheOptions> columns;
    for (KVStorage s : kAllStorages) {
      CacheOptions c = o->cache;
      c.storage = s;
      if (std::none_of(columns.begin(), columns.end(), [&](const CacheOptions& x) {
            return x.k_storage() == c.k_storage() && x.v_storage() == c.v_storage();
          }))
        columns.push_back(c);
    }
    const bool any_quantised = std::any_of(columns.begin(), columns.end(), [](const CacheOptions& c) {
      return is_quantised(c.k_storage()) || is_quantised(c.v_storage());
    });
    const std::string kivi =
        !any_quantised          ? std::string()
        : o->cache.kivi_group == 0
            ? std::string("KIVI simple scheme (--kivi-group 0): K scales over all stored tokens, no residual")
            : fmt::format("KIVI grouped: K scales per {} tokens, newest {}..{} tokens full precision",
                          o->cache.kivi_group, o->cache.kivi_residual,
                          o->cache.kivi_residual + o->cache.kivi_group - 1);
    const std::string path = o->model.empty() ? default_model_path() : o->model;
    LoadedModel lm = load_model(path);
    const auto shape = lm.model->cache_shape(1);
    nlohmann::json j;
    j["model"] = path;
    j["layers"] = shape.n_layers;
    j["kv_heads"] = shape.n_kv_heads;
    j["head_dim"] = shape.head_dim;
    j["kivi_group"] = o->cache.kivi_group;
    j["kivi_residual"] = o->cache.kivi_group > 0 ? nlohmann::json(o->cache.kivi_residual) : nlohmann::json(nullptr);
    if (o->cache.key_storage) j["kv_quantize_k"] = storage_name(*o->cache.key_storage);
    if (o->cache.value_storage) j["kv_quantize_v"] = storage_name(*o->cache.value_storage);
    if (!o->json) {
      fmt::print("KV cache bytes, {}: {} cache layers x {} KV heads x head_dim {} (measured from cache objects)\n",
                 path, shape.n_layers, shape.n_kv_heads, shape.head_dim);
      if (!kivi.empty()) fmt::print("{}\n", kivi);
      fmt::print("{:>7}", "tokens");
      for (const CacheOptions& c : columns) fmt::print("  {:>26}", eval::storage_label(c));
      fmt::print("\n");
    }
    for (int64_t T : lengths) {
      if (!o->json) fmt::print("{:>7}", T);
      nlohmann::json row;
      row["tokens"] = T;
      for (const CacheOptions& c : columns) {
        const Bytes b = measure(*lm.model, c, T);
        row[eval::storage_label(c)] = {{"payload", b.payload}, {"scales", b.scales}, {"total", b.payload + b.scales}};
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
