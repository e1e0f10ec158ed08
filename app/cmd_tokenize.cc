// `tokenize`: text -> ids and pieces (or ids -> text with --decode) using a
// model's tokenizer. Handy to check prompts and to compare with HF tokenizers.
#include <fmt/core.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common.h"
#include "core/error.h"
#include "engine/session.h"
#include "model/model.h"
#include "io/gguf.h"
#include "tokenizer/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::cli {

namespace {

// MODEL may be a model folder (uses its tokenizer.json + tokenizer_config.json),
// a tokenizer.json itself, a .tinygpt with an embedded tokenizer, or a .gguf
// (its tokenizer.ggml.* vocabulary, encoded as llama.cpp does).
Tokenizer open_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string tok = (fs::path(path) / "tokenizer.json").string();
    if (!fs::exists(tok, ec)) fail("{}: folder has no tokenizer.json", path);
    return Tokenizer::from_file(tok);
  }
  if (!fs::exists(path, ec))
    fail("{}: no such file or folder (expected a model folder, tokenizer.json, .tinygpt or .gguf)", path);
  if (path.ends_with(".gguf")) return tokenizer_from_gguf(GgufFile(path));
  if (path.ends_with(".tinygpt")) {
    std::string tok_json;
    Model::load_tinygpt(path, &tok_json);
    if (tok_json.empty()) fail("{}: this .tinygpt has no embedded tokenizer", path);
    return Tokenizer::from_json(tok_json);
  }
  return Tokenizer::from_file(path);
}

// Pieces can contain control bytes (byte-fallback newlines are "<0x0A>", but
// added tokens or raw vocab entries may hold "\n"); escape them for the table.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out.push_back(char(c));
  }
  return out;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void add_tokenize_command(CLI::App& root) {
  struct Opts {
    std::string model, text, decode;
    bool no_special = false, keep_special = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand("tokenize", "Encode text to token ids and pieces, or decode ids back to text");
  cmd->add_option("model", o->model,
                  "Model folder, tokenizer.json, .tinygpt or .gguf (default: the bundled flagship-27m)");
  CLI::Option* text = cmd->add_option("--text,-t", o->text, "Text to encode");
  CLI::Option* dec = cmd->add_option("--decode,-d", o->decode, "Comma-separated token ids to decode, e.g. 1,2,3");
  text->excludes(dec);
  cmd->add_flag("--no-special", o->no_special,
                "Encode without the post-processor's special tokens (e.g. BOS); special tokens written in the "
                "text are still recognised, except for a .gguf (llama.cpp's parse_special off: only "
                "user-defined tokens are matched)");
  cmd->add_flag("--keep-special", o->keep_special, "With --decode: keep special tokens in the text");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of a table");

  cmd->callback([o, text, dec] {
    if (!text->count() && !dec->count()) fail("tokenize: expected --text TEXT or --decode IDS");
    const Tokenizer tok = open_tokenizer(o->model.empty() ? default_model_path() : o->model);

    if (dec->count()) {
      const std::vector<int32_t> ids = parse_id_list(o->decode, "--decode");
      const std::string out = tok.decode(ids, !o->keep_special);
      if (o->json) {
        fmt::print("{}\n", dump_json({{"ids", ids}, {"text", out}}));
      } else {
        fmt::print("{}\n", out);
      }
      return;
    }

    // llama.cpp ties special parsing to the same switch (llama-tokenize --no-parse-special).
    const bool parse_special = !(o->no_special && tok.is_gguf_vocab());
    const std::vector<int32_t> ids = tok.encode(o->text, !o->no_special, parse_special);
    std::vector<std::string> pieces;
    pieces.reserve(ids.size());
    for (int32_t id : ids) pieces.push_back(tok.id_to_piece(id));
    if (o->json) {
      fmt::print("{}\n", dump_json({{"ids", ids}, {"pieces", pieces}}));
      return;
    }
    fmt::print("{:>5}  {:>8}  {}\n", "#", "id", "piece");
    for (size_t k = 0; k < ids.size(); ++k)
      fmt::print("{:>5}  {:>8}  {}{}\n", k, ids[k], printable(pieces[k]), tok.is_special(ids[k]) ? "  (special)" : "");
    fmt::print("{} tokens, {} bytes of text\n", ids.size(), o->text.size());
  });
}

}  // namespace ptllm::cli
