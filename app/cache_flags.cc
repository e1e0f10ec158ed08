#include "app/cache_flags.h"

#include "core/error.h"

namespace ptllm::cli {
namespace {

// CLI11 prints "<flag>: <message>" for a failed check and exits non-zero.
CLI::Validator integer_at_least(int64_t lo, std::string why) {
  return CLI::Validator(
      [lo, why](std::string& s) -> std::string {
        int64_t v = 0;
        size_t used = 0;
        try {
          v = std::stoll(s, &used);
        } catch (...) {
          used = 0;
        }
        if (used != s.size() || s.empty() || v < lo) return "got " + s + ", expected an integer >= " + std::to_string(lo) + why;
        return {};
      },
      "INT>=" + std::to_string(lo));
}

template <typename Parse>
CLI::Validator one_of(Parse parse, std::string desc) {
  return CLI::Validator(
      [parse](std::string& s) -> std::string {
        try {
          parse(s);
          return {};
        } catch (const Error& e) {
          // "--flag value: expected ..." -> "got value, expected ..." (CLI11 prefixes the flag).
          const std::string m = e.what();
          const size_t colon = m.find(": ");
          return "got " + s + ", " + (colon == std::string::npos ? m : m.substr(colon + 2));
        }
      },
      std::move(desc));
}

}  // namespace

void add_kivi_flags(CLI::App* cmd, CacheOptions& o) {
  cmd->add_option_function<std::string>(
         "--kv-quantize-k", [&o](const std::string& s) { o.key_storage = parse_storage(s, "--kv-quantize-k"); },
         "Storage of K only (overrides --kv-quantize for keys), e.g. --kv-quantize-k int4 --kv-quantize-v int2")
      ->check(one_of([](const std::string& s) { return parse_storage(s, "--kv-quantize-k"); },
                     "fp32|fp16|bf16|int8|int4|int2"));
  cmd->add_option_function<std::string>(
         "--kv-quantize-v", [&o](const std::string& s) { o.value_storage = parse_storage(s, "--kv-quantize-v"); },
         "Storage of V only (overrides --kv-quantize for values)")
      ->check(one_of([](const std::string& s) { return parse_storage(s, "--kv-quantize-v"); },
                     "fp32|fp16|bf16|int8|int4|int2"));
  cmd->add_option("--kivi-group", o.kivi_group,
                  "KIVI: K scales per group of G consecutive tokens (default 32); 0 = the simple scheme (scales over "
                  "all stored tokens, re-quantised on append)")
      ->check(integer_at_least(0, " (0 = the simple scheme)"));
  cmd->add_option("--kivi-residual", o.kivi_residual,
                  "KIVI: the newest R tokens stay full precision (default 128; a multiple of --kivi-group)")
      ->check(integer_at_least(0, ""));
}

void add_cache_flags(CLI::App* cmd, CacheOptions& o) {
  cmd->add_option_function<std::string>(
         "--kv-quantize", [&o](const std::string& s) { o.storage = parse_storage(s); },
         "KV cache storage of K and V: fp32 (default), fp16, bf16, int8, int4, int2 (int8/int4/int2 = KIVI: K "
         "per-channel, V per-token)")
      ->check(one_of([](const std::string& s) { return parse_storage(s); }, "fp32|fp16|bf16|int8|int4|int2"));
  add_kivi_flags(cmd, o);
  cmd->add_option("--streaming-llm-sink", o.sink,
                  "StreamingLLM: always keep the first N tokens (attention sinks); needs --streaming-llm-window")
      ->check(integer_at_least(0, ""));
  cmd->add_option("--streaming-llm-window", o.window,
                  "StreamingLLM: keep only the last M tokens beyond the sinks (bounds the cache to N+M tokens)")
      ->check(integer_at_least(1, " (leave both StreamingLLM flags out for an unbounded cache)"));
  cmd->add_option_function<std::string>(
         "--streaming-llm-rope", [&o](const std::string& s) { o.rope_mode = parse_rope_mode(s); },
         "reposition (default: keys stored before RoPE, rotated by cache slot) or absolute (keys keep their original "
         "position)")
      ->check(one_of(parse_rope_mode, "absolute|reposition"));
}

void add_sweep_flags(CLI::App* cmd, eval::SweepFlags& f, const std::string& kv_quantize_default) {
  cmd->add_option("--kv-quantize", f.kv_quantize,
                  "K/V storage, a comma list: fp32, fp16, bf16, int8, int4, int2 (default " + kv_quantize_default +
                      "; int8/int4/int2 = KIVI)");
  cmd->add_option("--kv-quantize-k", f.kv_quantize_k,
                  "Storage of K only (overrides --kv-quantize for keys); a comma list, paired with --kv-quantize-v");
  cmd->add_option("--kv-quantize-v", f.kv_quantize_v,
                  "Storage of V only (overrides --kv-quantize for values); a comma list, paired with --kv-quantize-k");
  cmd->add_option("--kivi-group", f.kivi_group,
                  "KIVI: K scales per group of G tokens, 0 = the simple scheme (default 32); a comma list, paired "
                  "with --kivi-residual");
  cmd->add_option("--kivi-residual", f.kivi_residual,
                  "KIVI: the newest R tokens stay full precision, a multiple of the group (default 128); a comma "
                  "list, paired with --kivi-group");
  cmd->add_option("--streaming-llm-sink", f.sink,
                  "Attention-sink tokens kept (default 0); a comma list, paired with --streaming-llm-window");
  cmd->add_option("--streaming-llm-window", f.window,
                  "Recent tokens kept (0 = unbounded cache, the default); a comma list, paired with "
                  "--streaming-llm-sink");
  cmd->add_option("--streaming-llm-rope", f.rope,
                  "RoPE positions of a bounded cache: reposition (default, by slot) or absolute; a comma list");
  cmd->footer(
      "Cache settings: each cache flag takes a comma list. Pairs are zipped (equal lengths, or one value used for "
      "every entry): --streaming-llm-sink with --streaming-llm-window, --kv-quantize-k with --kv-quantize-v, "
      "--kivi-group with --kivi-residual. Everything else is crossed: every (sink, window) x RoPE mode x (group, "
      "residual) x (K, V) x --kv-quantize combination runs, in that order, except that RoPE only varies for a "
      "bounded cache, group/residual only for int8/int4/int2, the residual only for group > 0, and settings that "
      "give the same cache run once. Example: --kv-quantize int4 --kivi-group 0,32 runs int4 simple and int4 G32 "
      "R128.");
}

}  // namespace ptllm::cli
