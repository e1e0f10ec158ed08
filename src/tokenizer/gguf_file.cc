// tokenizer.ggml.* <-> GgufVocab.
#include "tokenizer/gguf_file.h"

#include "core/error.h"

namespace ptllm {

namespace {
std::optional<int32_t> find_id(const GgufFile& f, const char* key) {
  const auto v = f.find_i64(key);
  if (!v) return std::nullopt;
  if (*v < 0 || *v > INT32_MAX) return std::nullopt;  // llama.cpp ignores such ids too
  return int32_t(*v);
}
}  // namespace

GgufVocab read_gguf_vocab(const GgufFile& f) {
  if (!f.has("tokenizer.ggml.model"))
    fail("{}: this GGUF has no embedded tokenizer (missing metadata key tokenizer.ggml.model)", f.path());
  GgufVocab v;
  v.model = f.get_string("tokenizer.ggml.model");
  v.pre = f.find_string("tokenizer.ggml.pre").value_or("");
  v.name = f.find_string("general.name").value_or("");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.scores")) v.scores = f.get_f32_array("tokenizer.ggml.scores");
  if (f.has("tokenizer.ggml.token_type")) v.token_type = f.get_i32_array("tokenizer.ggml.token_type");
  if (f.has("tokenizer.ggml.merges")) v.merges = f.get_string_array("tokenizer.ggml.merges");
  else if (v.model == "gpt2") fail("{}: gpt2 tokenizer without tokenizer.ggml.merges", f.path());
  v.bos = find_id(f, "tokenizer.ggml.bos_token_id");
  v.eos = find_id(f, "tokenizer.ggml.eos_token_id");
  v.unk = find_id(f, "tokenizer.ggml.unknown_token_id");
  v.pad = find_id(f, "tokenizer.ggml.padding_token_id");
  v.add_bos = f.find_bool("tokenizer.ggml.add_bos_token");
  v.add_eos = f.find_bool("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = f.find_bool("tokenizer.ggml.add_space_prefix");
  return v;
}

Tokenizer tokenizer_from_gguf(const GgufFile& f) { return tokenizer_from_gguf_vocab(read_gguf_vocab(f), f.path()); }

void write_gguf_vocab(const GgufVocab& v, GgufWriter& w) {
  w.set_string("tokenizer.ggml.model", v.model);
  w.set_string("tokenizer.ggml.pre", v.pre.empty() ? "default" : v.pre);
  w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.set_f32_array("tokenizer.ggml.scores", v.scores);
  if (!v.token_type.empty()) w.set_i32_array("tokenizer.ggml.token_type", v.token_type);
  if (!v.merges.empty()) w.set_string_array("tokenizer.ggml.merges", v.merges);
  if (v.bos) w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(*v.bos));
  if (v.eos) w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(*v.eos));
  if (v.unk) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(*v.unk));
  if (v.pad) w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(*v.pad));
  if (v.add_bos) w.set_bool("tokenizer.ggml.add_bos_token", *v.add_bos);
  if (v.add_eos) w.set_bool("tokenizer.ggml.add_eos_token", *v.add_eos);
  if (v.add_space_prefix) w.set_bool("tokenizer.ggml.add_space_prefix", *v.add_space_prefix);
}

void write_gguf_tokenizer(std::string_view tokenizer_json, std::string_view tokenizer_config_json, GgufWriter& w) {
  write_gguf_vocab(gguf_vocab_from_hf(tokenizer_json, tokenizer_config_json, "tokenizer.json"), w);
}

}  // namespace ptllm
