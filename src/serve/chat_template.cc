#include "serve/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace ptllm::serve {

namespace {

using json = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
}

std::string token_string(const json& config, const char* key, const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  fail("{}: {} must be a string or {{\"content\": string}}", path, key);
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, SpecialTokens tokens, std::string name)
    : template_(std::move(source), std::move(name)), tokens_(std::move(tokens)) {}

std::string ChatTemplate::render(const json& messages, bool add_generation_prompt, const json& extra) const {
  if (!messages.is_array()) throw jinja::RenderError(name() + ": messages must be a JSON array");
  if (!extra.is_object()) throw jinja::RenderError(name() + ": template variables must be a JSON object");
  json ctx = json::object();
  for (const auto& [k, v] : extra.items()) {
    if (k == "messages" || k == "add_generation_prompt" || k == "bos_token" || k == "eos_token")
      throw jinja::RenderError(name() + ": template variable '" + k + "' is set by the server, not the request");
    ctx[k] = v;
  }
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = tokens_.bos;
  ctx["eos_token"] = tokens_.eos;
  return template_.render(ctx, now_);
}

SpecialTokens read_special_tokens(const json& config, const std::string& path) {
  if (!config.is_object()) fail("{}: expected a JSON object", path);
  return {token_string(config, "bos_token", path), token_string(config, "eos_token", path)};
}

std::optional<std::string> read_chat_template(const json& config, const std::string& path) {
  if (!config.is_object()) fail("{}: expected a JSON object", path);
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& e : *it) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
          !e["template"].is_string())
        fail("{}: chat_template list entries must be {{\"name\": string, \"template\": string}}", path);
      if (e["name"] == "default") return e["template"].get<std::string>();
    }
    fail("{}: chat_template list has no entry named \"default\"", path);
  }
  fail("{}: chat_template must be a string or a list of {{name, template}}", path);
}

std::optional<ChatTemplate> chat_template_from_tokenizer_config(const std::string& path) {
  json config = read_json(path);
  auto source = read_chat_template(config, path);
  if (!source) return std::nullopt;
  return ChatTemplate(*source, read_special_tokens(config, path), path);
}

std::optional<ChatTemplate> load_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  fs::path dir(model_dir);
  std::string config_path = (dir / "tokenizer_config.json").string();
  SpecialTokens tokens;
  std::optional<std::string> source;
  std::string name = config_path;
  if (fs::exists(config_path)) {
    json config = read_json(config_path);
    tokens = read_special_tokens(config, config_path);
    source = read_chat_template(config, config_path);
  }
  if (fs::exists(dir / "chat_template.jinja")) {
    name = (dir / "chat_template.jinja").string();
    source = read_text(name);
  } else if (fs::exists(dir / "chat_template.json")) {
    name = (dir / "chat_template.json").string();
    source = read_chat_template(read_json(name), name);
  }
  if (!source) return std::nullopt;
  return ChatTemplate(*source, tokens, name);
}

ChatTemplate chat_template_from_file(const std::string& path, SpecialTokens tokens) {
  std::string text = read_text(path);
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    auto source = read_chat_template(read_json(path), path);
    if (!source) fail("{}: has no chat_template", path);
    text = *source;
  }
  return ChatTemplate(text, std::move(tokens), path);
}

}  // namespace ptllm::serve
