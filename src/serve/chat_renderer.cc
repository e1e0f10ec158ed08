#include "serve/chat_renderer.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "core/error.h"
#include "io/gguf.h"
#include "serve/chat_template.h"
#include "serve/jinja_error.h"
#include "serve/openai_schema.h"

namespace ptllm::serve {
namespace {

namespace fs = std::filesystem;

bool is_gguf(const std::string& path) { return fs::path(path).extension() == ".gguf"; }

// bos/eos strings: the folder's tokenizer_config.json when it names them, else
// the tokenizer's own pieces for the model's BOS/EOS ids.
SpecialTokens special_tokens(const std::string& model_path, const LoadedModel& lm) {
  SpecialTokens t;
  const fs::path cfg = fs::path(model_path) / "tokenizer_config.json";
  if (fs::is_directory(model_path) && fs::is_regular_file(cfg)) {
    std::ifstream f(cfg);
    try {
      t = read_special_tokens(nlohmann::ordered_json::parse(f), cfg.string());
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", cfg.string(), e.what());
    }
  }
  if (lm.tokenizer) {
    if (t.bos.empty() && lm.bos_id >= 0) t.bos = lm.tokenizer->id_to_piece(lm.bos_id);
    if (t.eos.empty() && !lm.eos_ids.empty()) t.eos = lm.tokenizer->id_to_piece(lm.eos_ids.front());
  }
  return t;
}

std::optional<ChatTemplate> model_template(const std::string& model_path, const SpecialTokens& tokens) {
  if (fs::is_directory(model_path)) {
    auto tpl = load_chat_template(model_path);
    if (!tpl) return std::nullopt;
    // The folder's template with the tokens resolved above (tokenizer_config or the vocabulary).
    return ChatTemplate(tpl->source(), tokens, tpl->name());
  }
  if (is_gguf(model_path)) {
    GgufFile g(model_path);
    if (auto src = g.find_string("tokenizer.chat_template"))
      return ChatTemplate(*src, tokens, model_path + ":tokenizer.chat_template");
  }
  return std::nullopt;
}

}  // namespace

ChatRenderer make_chat_renderer(const std::string& model_path, const std::string& template_file,
                                const LoadedModel& lm) {
  const SpecialTokens tokens = special_tokens(model_path, lm);
  std::optional<ChatTemplate> tpl;
  if (!template_file.empty()) {
    if (!fs::is_regular_file(template_file)) fail("--chat-template {}: no such file", template_file);
    tpl = chat_template_from_file(template_file, tokens);
  } else {
    tpl = model_template(model_path, tokens);
  }
  if (!tpl) return nullptr;
  auto shared = std::make_shared<const ChatTemplate>(std::move(*tpl));
  return [shared](const nlohmann::json& messages) {
    try {
      return shared->render(nlohmann::ordered_json::parse(messages.dump()), /*add_generation_prompt=*/true);
    } catch (const jinja::TemplateRaised& e) {
      // The template itself rejected the conversation (e.g. roles must alternate): the client's error.
      throw ApiError(400, std::string("messages: the chat template rejected the conversation: ") + e.raised_message,
                     "messages");
    }
  };
}

}  // namespace ptllm::serve
