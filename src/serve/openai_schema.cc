#include "serve/openai_schema.h"

#include <fmt/format.h>

#include <set>

#include "core/error.h"

namespace ptllm::serve {

using nlohmann::json;

json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw ApiError(400, fmt::format("request body is not valid JSON: {}", e.what()), "", "invalid_request_error",
                   "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "request body: expected a JSON object", "", "invalid_request_error", "invalid_json");
  return j;
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& what) {
  throw ApiError(400, fmt::format("{}: {}", param, what), param, "invalid_request_error", "invalid_value");
}

// The field, or nullptr when absent or null (OpenAI clients send null for "unset").
const json* field(const json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(name, fmt::format("expected an integer, got {}", v.dump()));
  // Unsigned values above INT64_MAX are out of range too.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) bad(name, fmt::format("expected <= {}", hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(name, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, x));
  return x;
}

double number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad(name, fmt::format("expected a number, got {}", v.dump()));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(name, fmt::format("expected a number in [{}, {}], got {}", lo, hi, x));
  return x;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, fmt::format("expected true or false, got {}", v.dump()));
  return v.get<bool>();
}

std::string string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, fmt::format("expected a string, got {}", v.dump()));
  return v.get<std::string>();
}

int32_t token_id(const json& v, const std::string& name, int32_t vocab) { return int32_t(integer(v, name, 0, vocab - 1)); }

// The most tokens a request may ask to generate.
constexpr int64_t kMaxTokensLimit = int64_t(1) << 30;

// logit_bias: {"TOKEN_ID": bias in [-100, 100], ...}, ids below `vocab`.
std::vector<std::pair<int32_t, float>> logit_bias(const json& v, int32_t vocab) {
  if (!v.is_object()) bad("logit_bias", fmt::format("expected an object of token id -> bias, got {}", v.dump()));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, b] : v.items()) {
    const std::string at = fmt::format("logit_bias.{}", key);
    int64_t id = -1;
    size_t used = 0;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != key.size() || id < 0 || id >= vocab)
      bad(at, fmt::format("expected a token id in [0, {}] as the key", vocab - 1));
    out.emplace_back(int32_t(id), float(number(b, at, -100, 100)));
  }
  return out;
}

// temperature, top_p, top_k, min_p, seed, presence_penalty, frequency_penalty, logit_bias,
// max_tokens (under `max_key`), stop, n, stream, ignore_eos, kv_cache.
GenParams parse_gen(const json& b, const CacheSpec& defaults, const char* max_key, int64_t max_default,
                    int32_t vocab) {
  GenParams g;
  g.max_tokens = max_default;
  g.sampler.temperature = 1.0;  // OpenAI's default
  g.sampler.top_p = 1.0;
  // 0 only where echo asks for the prompt alone (checked by parse_completion).
  if (const json* v = field(b, max_key)) g.max_tokens = integer(*v, max_key, 0, kMaxTokensLimit);
  if (const json* v = field(b, "temperature")) g.sampler.temperature = number(*v, "temperature", 0, 2);
  if (const json* v = field(b, "top_p")) {
    g.sampler.top_p = number(*v, "top_p", 0, 1);
    if (g.sampler.top_p <= 0) bad("top_p", "expected a number in (0, 1], got 0");
  }
  if (const json* v = field(b, "top_k")) g.sampler.top_k = integer(*v, "top_k", 0, int64_t(1) << 31);
  if (const json* v = field(b, "seed")) {
    g.sampler.seed = uint64_t(integer(*v, "seed", INT64_MIN, INT64_MAX));
    g.seeded = true;
  }
  if (const json* v = field(b, "min_p")) g.sampler.min_p = number(*v, "min_p", 0, 1);
  if (const json* v = field(b, "presence_penalty"))
    g.sampler.presence_penalty = number(*v, "presence_penalty", -2, 2);
  if (const json* v = field(b, "frequency_penalty"))
    g.sampler.frequency_penalty = number(*v, "frequency_penalty", -2, 2);
  if (const json* v = field(b, "logit_bias")) g.sampler.logit_bias = logit_bias(*v, vocab);
  if (const json* v = field(b, "n"); v && integer(*v, "n", 1, 1) != 1) bad("n", "only n = 1 is supported");
  if (const json* v = field(b, "stream")) g.stream = boolean(*v, "stream");
  if (const json* v = field(b, "ignore_eos")) g.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) bad("stream_options", "expected an object");
    if (const json* u = field(*v, "include_usage")) boolean(*u, "stream_options.include_usage");
  }
  if (const json* v = field(b, "stop")) {
    if (v->is_string()) {
      g.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 4) bad("stop", fmt::format("at most 4 stop strings, got {}", v->size()));
      for (size_t i = 0; i < v->size(); ++i) g.stop.push_back(string((*v)[i], fmt::format("stop[{}]", i)));
    } else {
      bad("stop", fmt::format("expected a string or an array of strings, got {}", v->dump()));
    }
    for (size_t i = 0; i < g.stop.size(); ++i)
      if (g.stop[i].empty()) bad(fmt::format("stop[{}]", i), "empty stop string");
  }
  g.cache = defaults;
  if (const json* v = field(b, "kv_cache")) g.cache = parse_kv_cache(*v, defaults);
  return g;
}

std::string model_name(const json& b) {
  const json* v = field(b, "model");
  return v ? string(*v, "model") : std::string();
}

}  // namespace

CacheSpec parse_kv_cache(const json& obj, const CacheSpec& defaults) {
  if (!obj.is_object()) bad("kv_cache", fmt::format("expected an object, got {}", obj.dump()));
  // The spec's own parser, field by field over the server's defaults (so a
  // request may change only the window), then its cross-field rules.
  CacheSpec o = defaults;
  const auto named = [](std::string_view f) { return "kv_cache." + std::string(f); };
  // "kv_cache.sink: got 4: expected 0 when kv_cache.window is 0 ..." (the issue names its own field).
  const auto fail_on = [&](const SpecIssue& issue) {
    const std::string field = named(issue.field), msg = issue.message(named);
    bad(field, msg.rfind(field + " ", 0) == 0 ? "got " + msg.substr(field.size() + 1) : msg);
  };
  // Which fields are strings and which integers: CacheSpec says (one owner).
  using Kind = CacheSpec::FieldKind;
  for (const auto& [key, v] : obj.items()) {
    if (v.is_null()) continue;  // null = the default
    std::string text;
    const Kind kind = CacheSpec::field_kind(key);
    if (kind == Kind::Text && v.is_string()) text = v.get<std::string>();
    else if (kind == Kind::Integer && v.is_number_integer()) text = v.dump();
    else if (kind != Kind::Unknown)
      bad(named(key), fmt::format("expected {}, got {}", kind == Kind::Text ? "a string" : "an integer", v.dump()));
    else text = v.dump();  // set() reports the unknown field
    if (auto issue = o.set(key, text)) fail_on(*issue);
  }
  if (auto issue = o.issue()) fail_on(*issue);
  return o;
}

CompletionRequest parse_completion(const json& b, const CacheSpec& defaults, int32_t vocab) {
  CompletionRequest r;
  r.model = model_name(b);
  const json* p = field(b, "prompt");
  if (!p) bad("prompt", "required");
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < p->size(); ++i) ids.push_back(token_id((*p)[i], fmt::format("prompt[{}]", i), vocab));
    r.prompt = std::move(ids);
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    r.prompt = (*p)[0].get<std::string>();  // the openai client may wrap one prompt in an array
  } else if (p->is_array() && p->size() == 1 && (*p)[0].is_array() && !(*p)[0].empty()) {
    // One prompt of token ids in a batch of one (lm-evaluation-harness sends these).
    const json& inner = (*p)[0];
    std::vector<int32_t> ids;
    for (size_t i = 0; i < inner.size(); ++i) ids.push_back(token_id(inner[i], fmt::format("prompt[0][{}]", i), vocab));
    r.prompt = std::move(ids);
  } else if (p->is_array() && p->size() > 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    bad("prompt", fmt::format("{} prompts in one request; send one prompt per request", p->size()));
  } else {
    bad("prompt", "expected a string, an array of token ids, or an array of one string or of one array of ids");
  }
  r.gen = parse_gen(b, defaults, "max_tokens", 16, vocab);
  // The legacy endpoint's "logprobs" is the count of most likely tokens to list (OpenAI: up
  // to 5; 20 here, as vLLM and the chat endpoint allow).
  if (const json* v = field(b, "logprobs")) r.gen.logprobs = int(integer(*v, "logprobs", 0, kMaxTopLogprobs));
  if (const json* v = field(b, "echo")) r.gen.echo = boolean(*v, "echo");
  if (r.gen.max_tokens == 0 && !r.gen.echo)
    bad("max_tokens", fmt::format("expected an integer in [1, {}], got 0 (0 only with \"echo\": true)", kMaxTokensLimit));
  return r;
}

ChatRequest parse_chat(const json& b, const CacheSpec& defaults, int32_t vocab) {
  ChatRequest r;
  r.model = model_name(b);
  const json* m = field(b, "messages");
  if (!m) bad("messages", "required");
  if (!m->is_array() || m->empty()) bad("messages", "expected a non-empty array of messages");
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!msg.is_object()) bad(at, "expected an object with role and content");
    const json* role = field(msg, "role");
    if (!role) bad(at + ".role", "required");
    string(*role, at + ".role");
    const json* content = field(msg, "content");
    if (content && !content->is_string() && !content->is_array())
      bad(at + ".content", fmt::format("expected a string or an array of parts, got {}", content->dump()));
  }
  r.messages = *m;
  // max_completion_tokens is the newer name; max_tokens is still sent by older clients.
  const bool has_new = field(b, "max_completion_tokens") != nullptr;
  r.gen = parse_gen(b, defaults, has_new ? "max_completion_tokens" : "max_tokens", 256, vocab);
  if (r.gen.max_tokens == 0)
    bad(has_new ? "max_completion_tokens" : "max_tokens", fmt::format("expected an integer in [1, {}], got 0", kMaxTokensLimit));
  const json* lp = field(b, "logprobs");
  const bool want = lp && boolean(*lp, "logprobs");
  if (const json* v = field(b, "top_logprobs")) {
    const int top = int(integer(*v, "top_logprobs", 0, kMaxTopLogprobs));
    if (!want) bad("top_logprobs", "requires \"logprobs\": true");
    r.gen.logprobs = top;
  } else if (want) {
    r.gen.logprobs = 0;
  }
  return r;
}

}  // namespace ptllm::serve
