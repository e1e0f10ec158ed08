#include "app/cache_flags.h"

#include <utility>

#include "core/error.h"

namespace ptllm::cli {
namespace {

// One flag per CacheSpec field (kv/cache_spec.h has the fields' meaning), in
// --help order; `kivi` marks the ones cache-table takes too.
struct CacheFlag {
  std::string_view field, flag, type, help;
  bool kivi;
};
constexpr std::string_view kStorages = "fp32|fp16|bf16|int8|int4|int3|int2";
constexpr CacheFlag kFlags[] = {
    {"quantize", "--kv-quantize", kStorages,
     "KV cache storage of K and V: fp32 (default), fp16, bf16, int8, int4, int3, int2 (int8/int4/int3/int2 = KIVI: "
     "K per-channel, V per-token)",
     false},
    {"quantize_k", "--kv-quantize-k", kStorages,
     "Storage of K only (overrides --kv-quantize for keys), e.g. --kv-quantize-k int4 --kv-quantize-v int2", true},
    {"quantize_v", "--kv-quantize-v", kStorages, "Storage of V only (overrides --kv-quantize for values)", true},
    {"kivi_group", "--kivi-group", "INT>=0",
     "KIVI: K scales per group of G consecutive tokens (default 32); 0 = the simple scheme (scales over all stored "
     "tokens, re-quantised on append)",
     true},
    {"kivi_residual", "--kivi-residual", "INT>=0",
     "KIVI: the newest R tokens stay full precision (default 128; a multiple of --kivi-group)", true},
    {"residual_dtype", "--kivi-residual-dtype", "fp32|fp16|bf16",
     "Grouped KIVI: storage of the residual and sink tokens, fp16 (default), bf16 or fp32; widened to fp32 for "
     "attention",
     true},
    {"k_axis", "--kivi-k-axis", "channel|token",
     "Grouped KIVI keys: channel (default; per channel in groups of --kivi-group) or token (one scale+zero per "
     "token)",
     true},
    {"rotate", "--kv-rotate", "none|hadamard",
     "Rotate K (after RoPE), Q and V per KV head by a fixed seeded randomised Hadamard transform before storing "
     "(scores unchanged; outliers spread before quantising); needs head_dim a power of two",
     true},
    {"sink", "--streaming-llm-sink", "INT>=0",
     "StreamingLLM: always keep the first N tokens (attention sinks); needs --streaming-llm-window", false},
    {"window", "--streaming-llm-window", "INT>=0",
     "StreamingLLM: keep only the last M tokens beyond the sinks (bounds the cache to N+M tokens); 0 = unbounded "
     "(the default)",
     false},
    {"rope", "--streaming-llm-rope", "absolute|reposition",
     "reposition (default: keys stored before RoPE, rotated by cache slot) or absolute (keys keep their original "
     "position)",
     false},
};

// Adds the flag of `f`; its value goes straight into spec.set, which parses it
// once. A bad value is a CLI11 error "<flag>: got <value>, expected ...".
void add_spec_flag(CLI::App* cmd, CacheSpec& spec, const CacheFlag& f) {
  const std::string flag(f.flag);
  const std::string_view field = f.field;
  cmd->add_option_function<std::string>(
         flag,
         [&spec, field, flag](const std::string& s) {
           if (auto issue = spec.set(field, s)) throw CLI::ValidationError(flag, "got " + s + ", expected " + issue->expected);
         },
         std::string(f.help))
      ->type_name(std::string(f.type));
}

}  // namespace

std::string cache_flag_name(std::string_view field) {
  for (const CacheFlag& f : kFlags)
    if (f.field == field) return std::string(f.flag);
  return std::string(field);
}

std::string flag_message(const CacheSpecError& e) { return e.issue().message(cache_flag_name); }

void add_kivi_flags(CLI::App* cmd, CacheSpec& o) {
  for (const CacheFlag& f : kFlags)
    if (f.kivi) add_spec_flag(cmd, o, f);
}

void add_cache_flags(CLI::App* cmd, CacheSpec& o) {
  for (const CacheFlag& f : kFlags) add_spec_flag(cmd, o, f);
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
  cmd->add_option("--kivi-residual-dtype", f.residual_dtype,
                  "Grouped KIVI: residual and sink storage, fp16 (default), bf16 or fp32; a comma list");
  cmd->add_option("--kv-rotate", f.rotate,
                  "none (default) or hadamard: the seeded Hadamard rotation of K, Q, V before storing; a comma list");
  cmd->add_option("--kivi-k-axis", f.k_axis, "Grouped KIVI keys per channel (default) or per token; a comma list");
  cmd->footer(
      "Cache settings: each cache flag takes a comma list. Pairs are zipped (equal lengths, or one value used for "
      "every entry): --streaming-llm-sink with --streaming-llm-window, --kv-quantize-k with --kv-quantize-v, "
      "--kivi-group with --kivi-residual. Everything else is crossed: every (sink, window) x RoPE mode x (group, "
      "residual) x (K, V) x residual dtype x rotation x K axis x --kv-quantize combination runs, in that order, except "
      "that RoPE only varies for a "
      "bounded cache, group/residual only for int8/int4/int2, the residual only for group > 0, and settings that "
      "give the same cache run once. Example: --kv-quantize int4 --kivi-group 0,32 runs int4 simple and int4 G32 "
      "R128.");
}

}  // namespace ptllm::cli
