#include "app/cache_flags.h"

#include <utility>

#include "core/error.h"

namespace ptllm::cli {
namespace {

// One flag per CacheSpec field (kv/cache_spec.h has the fields' meaning).
constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
    {"quantize", "--kv-quantize"},          {"quantize_k", "--kv-quantize-k"},
    {"quantize_v", "--kv-quantize-v"},      {"sink", "--streaming-llm-sink"},
    {"window", "--streaming-llm-window"},   {"rope", "--streaming-llm-rope"},
    {"kivi_group", "--kivi-group"},         {"kivi_residual", "--kivi-residual"},
    {"residual_dtype", "--kivi-residual-dtype"}, {"rotate", "--kv-rotate"},
    {"k_axis", "--kivi-k-axis"}};

// Adds the flag of `field`; its value goes straight into spec.set, which parses
// it once. A bad value is a CLI11 error "<flag>: got <value>, expected ...".
void add_spec_flag(CLI::App* cmd, CacheSpec& spec, std::string_view field, const std::string& help,
                   const std::string& type) {
  const std::string flag = cache_flag_name(field);
  cmd->add_option_function<std::string>(
         flag,
         [&spec, field, flag](const std::string& s) {
           if (auto issue = spec.set(field, s)) throw CLI::ValidationError(flag, "got " + s + ", expected " + issue->expected);
         },
         help)
      ->type_name(type);
}

}  // namespace

std::string cache_flag_name(std::string_view field) {
  for (const auto& [f, flag] : kFlags)
    if (f == field) return std::string(flag);
  return std::string(field);
}

std::string flag_message(const CacheSpecError& e) { return e.issue().message(cache_flag_name); }

void add_kivi_flags(CLI::App* cmd, CacheSpec& o) {
  add_spec_flag(cmd, o, "quantize_k",
                "Storage of K only (overrides --kv-quantize for keys), e.g. --kv-quantize-k int4 --kv-quantize-v int2",
                "fp32|fp16|bf16|int8|int4|int3|int2");
  add_spec_flag(cmd, o, "quantize_v", "Storage of V only (overrides --kv-quantize for values)",
                "fp32|fp16|bf16|int8|int4|int3|int2");
  add_spec_flag(cmd, o, "kivi_group",
                "KIVI: K scales per group of G consecutive tokens (default 32); 0 = the simple scheme (scales over "
                "all stored tokens, re-quantised on append)",
                "INT>=0");
  add_spec_flag(cmd, o, "kivi_residual",
                "KIVI: the newest R tokens stay full precision (default 128; a multiple of --kivi-group)", "INT>=0");
  add_spec_flag(cmd, o, "residual_dtype",
                "Grouped KIVI: storage of the residual and sink tokens, fp16 (default), bf16 or fp32; widened to fp32 "
                "for attention",
                "fp32|fp16|bf16");
  add_spec_flag(cmd, o, "k_axis",
                "Grouped KIVI keys: channel (default; per channel in groups of --kivi-group) or token (one scale+zero "
                "per token)",
                "channel|token");
  add_spec_flag(cmd, o, "rotate",
                "Rotate K (after RoPE), Q and V per KV head by a fixed seeded randomised Hadamard transform before "
                "storing (scores unchanged; outliers spread before quantising); needs head_dim a power of two",
                "none|hadamard");
}

void add_cache_flags(CLI::App* cmd, CacheSpec& o) {
  add_spec_flag(cmd, o, "quantize",
                "KV cache storage of K and V: fp32 (default), fp16, bf16, int8, int4, int3, int2 (int8/int4/int3/int2 = KIVI: K "
                "per-channel, V per-token)",
                "fp32|fp16|bf16|int8|int4|int3|int2");
  add_kivi_flags(cmd, o);
  add_spec_flag(cmd, o, "sink",
                "StreamingLLM: always keep the first N tokens (attention sinks); needs --streaming-llm-window",
                "INT>=0");
  add_spec_flag(cmd, o, "window",
                "StreamingLLM: keep only the last M tokens beyond the sinks (bounds the cache to N+M tokens); 0 = "
                "unbounded (the default)",
                "INT>=0");
  add_spec_flag(cmd, o, "rope",
                "reposition (default: keys stored before RoPE, rotated by cache slot) or absolute (keys keep their "
                "original position)",
                "absolute|reposition");
}
void add_sweep_flags(CLI::App* cmd, eval::SweepFlags& f, const std::string& kv_quantize_default) {
  cmd->add_option("--kv-quantize", f.kv_quantize,
                  "K/V storage, a comma list: fp32, fp16, bf16, int8, int4, int3, int2 (default " + kv_quantize_default +
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
