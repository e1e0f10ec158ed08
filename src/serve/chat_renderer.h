// Which chat template a served model uses, and the renderer the HTTP layer
// calls for /v1/chat/completions: --chat-template FILE, else the model's own
// (a folder's chat_template.jinja / tokenizer_config.json, or a GGUF file's
// tokenizer.chat_template), else none (chat requests get a 400 that says so).
#pragma once
#include <string>

#include "engine/session.h"
#include "serve/http_server.h"

namespace ptllm::serve {

// Returns nullptr when neither the flag nor the model provides a template.
// Throws Error naming the file when a template exists but does not parse.
ChatRenderer make_chat_renderer(const std::string& model_path, const std::string& template_file,
                                const LoadedModel& lm);

}  // namespace ptllm::serve
