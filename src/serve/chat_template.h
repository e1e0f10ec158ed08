// A model's chat template: messages -> the prompt text the model was trained on.
//
//   auto tpl = serve::load_chat_template(model_dir);        // std::nullopt: none
//   std::string prompt = tpl->render(messages, true, {{"tools", tools}});
//
// The template is the model's own `chat_template` (tokenizer_config.json, or
// chat_template.jinja / chat_template.json beside it, as newer transformers
// save it), rendered as transformers does: variables `messages`,
// `add_generation_prompt`, `bos_token`, `eos_token`, plus any extras
// (`tools`, `documents`, `enable_thinking`, ...) passed through as given.
#pragma once
#include <ctime>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/jinja.h"

namespace ptllm::serve {

struct SpecialTokens {
  std::string bos, eos;  // empty when the config names none
};

class ChatTemplate {
 public:
  // Parses now: a syntax error throws ptllm::Error naming `name` and line:col.
  ChatTemplate(std::string source, SpecialTokens tokens, std::string name = "chat_template");

  // Thread-safe: render() is const and keeps all its state on its own stack.
  // messages: JSON array of {role, content, ...}. extra: JSON object whose
  // keys become template variables (they cannot replace messages /
  // add_generation_prompt / bos_token / eos_token). Throws
  // jinja::TemplateRaised when the template rejects the conversation
  // (raise_exception), jinja::RenderError (a ptllm::Error) otherwise.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // The clock strftime_now reads (tests pin it); local system time by default.
  void set_clock(std::function<std::tm()> now) { now_ = std::move(now); }

  const SpecialTokens& tokens() const { return tokens_; }
  const std::string& source() const { return template_.source(); }
  const std::string& name() const { return template_.name(); }

 private:
  jinja::Template template_;
  SpecialTokens tokens_;
  std::function<std::tm()> now_;
};

// bos_token / eos_token of a tokenizer_config.json (a string or {"content": ...}).
SpecialTokens read_special_tokens(const nlohmann::ordered_json& config, const std::string& path);
// Its chat_template: a string, or a list of {name, template} (the one named
// "default"); std::nullopt when there is none. `path` names errors.
std::optional<std::string> read_chat_template(const nlohmann::ordered_json& config, const std::string& path);

// From a tokenizer_config.json file; std::nullopt when it has no template.
std::optional<ChatTemplate> chat_template_from_tokenizer_config(const std::string& path);
// From a model folder: chat_template.jinja, else chat_template.json, else
// tokenizer_config.json; special tokens from tokenizer_config.json when
// present. std::nullopt when the model has no template.
std::optional<ChatTemplate> load_chat_template(const std::string& model_dir);
// --chat-template FILE: the template text of FILE (a .jinja file, or a JSON
// file holding chat_template like tokenizer_config.json) with the model's
// special tokens.
ChatTemplate chat_template_from_file(const std::string& path, SpecialTokens tokens);

}  // namespace ptllm::serve
