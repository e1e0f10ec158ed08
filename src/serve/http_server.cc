#include "serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "serve/openai_schema.h"
#include "serve/stop_text.h"

namespace ptllm::serve {

using nlohmann::json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(j.dump(), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_json(e)); }

// One generated token's logprobs as the HTTP side writes them (OpenAI's two shapes are
// made from it): its text inside the generated text, its bytes, its offset in the text.
struct TokenEntry {
  struct Alt {
    std::string text;
    std::vector<int> bytes;
    double logprob;
  };
  Alt chosen;
  std::vector<Alt> top;
  size_t offset = 0;
  bool scored = true;  // false: an echoed prompt's first token (nothing before it to score it)
};

// Released text and the logprobs of the tokens it completes (logprobs on: a token whose text
// is held back gets its entry sent with the piece that releases it).
struct Piece {
  std::string text;
  std::vector<TokenEntry> tokens;
};

// What the scheduler thread hands to the HTTP thread answering one request.
struct Output {
  std::mutex mu;
  std::condition_variable cv;
  // Released text not yet sent: one piece per token (a stream sends each as
  // its own event, so a client sees one event per token as from llama-server
  // or OpenAI, however far the writer is behind) plus the held-back rest.
  std::vector<Piece> pending;
  bool done = false;
  FinishReason reason = FinishReason::Stop;
  std::string error;
  int64_t completion_tokens = 0;
};

// One generation request being answered.
struct Generation {
  std::shared_ptr<Job> job;
  std::shared_ptr<Output> out;
  bool chat = false;
  bool logprobs = false;
  std::string id, model;
  int64_t created = 0, prompt_tokens = 0;
};

// OpenAI's logprobs objects. Completions: {"tokens", "token_logprobs", "top_logprobs" (a
// {text: logprob} object per token), "text_offset"}; chat: {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}.
json logprobs_json(const std::vector<TokenEntry>& tokens, bool chat) {
  if (chat) {
    json content = json::array();
    for (const TokenEntry& t : tokens) {
      json top = json::array();
      for (const auto& a : t.top) top.push_back({{"token", a.text}, {"logprob", a.logprob}, {"bytes", a.bytes}});
      content.push_back({{"token", t.chosen.text},
                         {"logprob", t.chosen.logprob},
                         {"bytes", t.chosen.bytes},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenEntry& t : tokens) {
    texts.push_back(t.chosen.text);
    lps.push_back(t.scored ? json(t.chosen.logprob) : json(nullptr));
    json top = json::object();
    for (const auto& a : t.top) top[a.text] = a.logprob;
    tops.push_back(t.scored ? std::move(top) : json(nullptr));
    offsets.push_back(t.offset);
  }
  return {{"tokens", std::move(texts)}, {"token_logprobs", std::move(lps)}, {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// The plain token token_alt() decodes each token after, and its own text.
struct Anchor {
  int32_t id = -1;  // -1: none (each token decoded alone)
  std::string text;
};

// A token's own text as it reads inside generated text, leading space kept: decoders strip
// the first token's space (SentencePiece's Strip), so the token is decoded after the anchor
// and the anchor's text taken off. Its bytes: a byte piece ("<0xE2>") its one byte, else the
// UTF-8 of its text (a lone byte decodes to U+FFFD, as OpenAI's does).
TokenEntry::Alt token_alt(const Tokenizer& tok, const Anchor& anchor, int32_t id, double logprob) {
  TokenEntry::Alt alt{{}, {}, logprob};
  std::string both;
  if (anchor.id >= 0) {
    const int32_t pair[2] = {anchor.id, id};
    both = tok.decode(pair, false);
  }
  if (anchor.id >= 0 && both.compare(0, anchor.text.size(), anchor.text) == 0)
    alt.text = both.substr(anchor.text.size());
  else
    alt.text = tok.decode(std::span<const int32_t>(&id, 1), false);
  const std::string piece = tok.id_to_piece(id);
  unsigned byte = 0;
  if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>' &&
      std::sscanf(piece.c_str() + 3, "%2x", &byte) == 1)
    alt.bytes = {int(byte)};
  else
    for (const unsigned char c : alt.text) alt.bytes.push_back(int(c));
  return alt;
}

// A token's entry: its own alternative and those of the `top` most likely.
TokenEntry token_entry(const Tokenizer& tok, const Anchor& anchor, int32_t id, double logprob,
                       const std::vector<TokenLogprob>& top) {
  TokenEntry e;
  e.chosen = token_alt(tok, anchor, id, logprob);
  for (const TokenLogprob& t : top) e.top.push_back(token_alt(tok, anchor, t.id, t.logprob));
  return e;
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions opt;
  const LoadedModel& lm;
  Backend& backend;
  Scheduler& sched;
  Metrics& metrics;
  ChatRenderer chat;
  HttpServer& owner;
  httplib::Server svr;
  std::atomic<bool> draining{false};
  std::atomic<uint64_t> next_id{1};
  std::once_flag anchor_once;
  Anchor anchor;  // token_alt()'s: the token of "a"

  Impl(ServerOptions o, const LoadedModel& lm, Backend& b, Scheduler& s, Metrics& m, ChatRenderer c, HttpServer& h)
      : opt(std::move(o)), lm(lm), backend(b), sched(s), metrics(m), chat(std::move(c)), owner(h) {}

  void routes();
  bool authorised(const httplib::Request& req, httplib::Response& res);
  std::vector<int32_t> completion_prompt(const CompletionRequest& r);
  void generate(const httplib::Request& req, httplib::Response& res, bool chat_endpoint);
  // echo_text: what "echo" puts before the completion (the prompt as sent).
  Generation submit(std::vector<int32_t> prompt, const GenParams& g, bool chat_endpoint, const std::string& model,
                    const std::string& echo_text = {});
  json final_body(const Generation& g, const std::string& text, const std::vector<TokenEntry>& tokens) const;
  json chunk(const Generation& g, const Piece& piece, bool first, const FinishReason* fin) const;
  void stream(httplib::Response& res, Generation g);
};

bool HttpServer::Impl::authorised(const httplib::Request& req, httplib::Response& res) {
  if (opt.api_key.empty() || req.path == "/health" || req.path == "/metrics") return true;
  if (req.get_header_value("Authorization") == "Bearer " + opt.api_key) return true;
  metrics.rejected("unauthorized");
  send_error(res, ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY)", "",
                           "invalid_request_error", "invalid_api_key"));
  return false;
}

std::vector<int32_t> HttpServer::Impl::completion_prompt(const CompletionRequest& r) {
  if (const auto* ids = std::get_if<std::vector<int32_t>>(&r.prompt)) return *ids;
  if (!lm.tokenizer) throw ApiError(400, "prompt: the model has no tokenizer; send token ids", "prompt");
  std::vector<int32_t> ids = lm.tokenizer->encode(std::get<std::string>(r.prompt), true);
  if (ids.empty() && lm.bos_id >= 0) ids.push_back(lm.bos_id);
  if (ids.empty()) throw ApiError(400, "prompt: empty, and the model has no BOS token to start from", "prompt");
  return ids;
}

Generation HttpServer::Impl::submit(std::vector<int32_t> prompt, const GenParams& gp, bool chat_endpoint,
                                    const std::string& model, const std::string& echo_text) {
  const int64_t ctx = backend.context_length();
  if (!gp.cache.streaming() && int64_t(prompt.size()) > ctx)
    throw ApiError(400, fmt::format("prompt: {} tokens, longer than the model's context of {} tokens (a bounded "
                                    "kv_cache with sink + window takes any length)", prompt.size(), ctx), "prompt",
                   "invalid_request_error", "context_length_exceeded");
  Generation g;
  g.chat = chat_endpoint;
  g.id = fmt::format("{}-{}", chat_endpoint ? "chatcmpl" : "cmpl", next_id++);
  g.model = model.empty() ? opt.model_name : model;
  g.created = unix_now();
  g.prompt_tokens = int64_t(prompt.size());
  g.logprobs = gp.logprobs >= 0;
  g.out = std::make_shared<Output>();
  g.job = std::make_shared<Job>();
  Job& job = *g.job;
  job.prompt = std::move(prompt);
  job.cache = gp.cache;
  job.sampler = gp.sampler;
  if (!gp.seeded) job.sampler.seed = std::random_device{}();
  job.max_tokens = gp.max_tokens;
  job.ignore_eos = gp.ignore_eos;
  // Decoding and stop strings run on the scheduler thread, so the HTTP thread only copies text.
  // Byte-fallback runs go out a whole character at a time (ByteRuns::Eager, tokenizer.h), as
  // llama-server sends them: a "<0x0A>" newline at its own step, not with the next token.
  struct TextState {
    StreamDecoder dec;
    StopText stop;
    std::vector<TokenEntry> waiting;  // logprobs of tokens whose text is not yet released
    size_t offset = 0;                // text_offset of the next token: the text decoded before it
  };
  auto ts = std::make_shared<TextState>(
      TextState{StreamDecoder(*lm.tokenizer, true, ByteRuns::Eager), StopText(gp.stop), {},
                gp.echo ? echo_text.size() : 0});
  // echo without logprobs: the prompt's text is the first piece, before anything runs.
  if (gp.echo && gp.logprobs < 0) g.out->pending.push_back(Piece{echo_text, {}});
  auto out = g.out;
  job.logprobs = gp.logprobs;
  if (gp.logprobs >= 0) {
    std::call_once(anchor_once, [&] {
      const std::vector<int32_t> a = lm.tokenizer->encode("a", false);
      if (!a.empty()) anchor = {a.back(), lm.tokenizer->decode(std::span<const int32_t>(&a.back(), 1), false)};
    });
    if (gp.echo) {
      // The echoed prompt's entries, all in the first piece: the first token unscored, each
      // later one scored by the logits before it.
      job.prompt_logprobs = gp.logprobs;
      job.on_prompt_logprobs = [tok = *lm.tokenizer, anchor = anchor, first = job.prompt.front(), echo_text,
                                out](std::vector<StepLogprobs> lps) {
        std::vector<TokenEntry> entries;
        // text_offset: how much of the prompt's decoded text comes before the token.
        StreamDecoder dec(tok, true, ByteRuns::Eager);
        size_t offset = 0;
        const auto add = [&](int32_t id, double lp, bool scored, const std::vector<TokenLogprob>& top) {
          TokenEntry e = token_entry(tok, anchor, id, lp, top);
          e.scored = scored;
          e.offset = offset;
          offset += dec.push(id).size();
          entries.push_back(std::move(e));
        };
        add(first, 0, false, {});
        for (const StepLogprobs& lp : lps) add(lp.chosen.id, lp.chosen.logprob, true, lp.top);
        {
          std::lock_guard lk(out->mu);
          out->pending.insert(out->pending.begin(), Piece{echo_text, std::move(entries)});
        }
        out->cv.notify_all();
      };
    }
    // A copy of the tokenizer (it shares its tables) for the scheduler thread.
    job.on_logprobs = [tok = *lm.tokenizer, anchor = anchor, ts](const StepLogprobs& lp) {
      TokenEntry e = token_entry(tok, anchor, lp.chosen.id, lp.chosen.logprob, lp.top);
      e.offset = ts->offset;  // the text released before this token
      ts->waiting.push_back(std::move(e));
    };
  }
  job.on_token = [ts, out](int32_t id) {
    const std::string decoded = ts->dec.push(id);
    ts->offset += decoded.size();
    std::string text = ts->stop.push(decoded);
    {
      std::lock_guard lk(out->mu);
      ++out->completion_tokens;
      if (!text.empty()) {
        out->pending.push_back({std::move(text), std::move(ts->waiting)});
        ts->waiting.clear();
      }
    }
    // Notified with the lock released: the writer runs at a higher priority than this
    // thread (--compute-nice) and would otherwise wake only to wait for the lock.
    out->cv.notify_all();
    return !ts->stop.stopped();
  };
  job.on_finish = [ts, out](FinishReason r, const std::string& error) {
    std::string rest = ts->stop.push(ts->dec.flush());  // a held-back partial character, then held-back text
    rest += ts->stop.flush();
    {
      std::lock_guard lk(out->mu);
      if (!rest.empty() || !ts->waiting.empty()) out->pending.push_back({std::move(rest), std::move(ts->waiting)});
      out->done = true;
      out->reason = r;
      out->error = error;
    }
    out->cv.notify_all();
  };
  std::string why;
  switch (sched.submit(g.job, &why)) {
    case Admit::Queued: break;
    case Admit::QueueFull:
      metrics.rejected("queue_full");
      throw ApiError(429, "server busy: the request queue is full (--max-queue); retry later", "", "rate_limit_error",
                     "queue_full");
    case Admit::Draining:
      metrics.rejected("draining");
      throw ApiError(503, "server is shutting down", "", "server_error", "draining");
    case Admit::TooLarge:
      metrics.rejected("too_large");
      throw ApiError(400, "kv_cache: " + why, "kv_cache", "invalid_request_error", "kv_budget_exceeded");
  }
  return g;
}

json HttpServer::Impl::final_body(const Generation& g, const std::string& text,
                                  const std::vector<TokenEntry>& tokens) const {
  const Output& o = *g.out;
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason_name(o.reason)},
                 {"logprobs", g.logprobs ? logprobs_json(tokens, g.chat) : json(nullptr)}};
  if (g.chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  return {{"id", g.id},
          {"object", g.chat ? "chat.completion" : "text_completion"},
          {"created", g.created},
          {"model", g.model},
          {"choices", json::array({choice})},
          {"usage",
           {{"prompt_tokens", g.prompt_tokens},
            {"completion_tokens", o.completion_tokens},
            {"total_tokens", g.prompt_tokens + o.completion_tokens}}}};
}

// One SSE event's JSON. `fin` set: the last chunk, with finish_reason and usage.
json HttpServer::Impl::chunk(const Generation& g, const Piece& piece, bool first, const FinishReason* fin) const {
  const std::string& text = piece.text;
  json choice = {{"index", 0}, {"finish_reason", fin ? json(finish_reason_name(*fin)) : json(nullptr)}};
  if (g.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !fin) delta["content"] = text;
    choice["delta"] = delta;
    if (g.logprobs) choice["logprobs"] = logprobs_json(piece.tokens, true);
  } else {
    choice["text"] = text;
    choice["logprobs"] = g.logprobs ? logprobs_json(piece.tokens, false) : json(nullptr);
  }
  json j = {{"id", g.id},
            {"object", g.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", g.created},
            {"model", g.model},
            {"choices", json::array({choice})}};
  if (fin) {
    const int64_t n = g.out->completion_tokens;
    j["usage"] = {{"prompt_tokens", g.prompt_tokens}, {"completion_tokens", n}, {"total_tokens", g.prompt_tokens + n}};
  }
  return j;
}

void HttpServer::Impl::stream(httplib::Response& res, Generation g) {
  auto first = std::make_shared<bool>(true);
  Scheduler* sc = &sched;
  auto job = g.job;
  std::atomic<int64_t>* inflight = &owner.in_flight_;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // nginx: do not buffer this response
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, g, first, sc](size_t, httplib::DataSink& sink) {
        const auto event = [&](const json& j) {
          const std::string s = "data: " + j.dump() + "\n\n";
          return sink.write(s.data(), s.size());
        };
        std::vector<Piece> pieces;
        bool done = false;
        {
          std::unique_lock lk(g.out->mu);
          g.out->cv.wait_for(lk, std::chrono::milliseconds(500), [&] { return !g.out->pending.empty() || g.out->done; });
          pieces.swap(g.out->pending);
          done = g.out->done;
        }
        // A failed write is how a disconnect shows: cancel, and the scheduler frees the cache.
        const auto cancel = [&] {
          g.job->cancelled = true;
          sc->wake();
          return false;
        };
        if (!pieces.empty() || (*first && g.chat && !done)) {
          // Every piece its own event, all of them in one write.
          std::string batch;
          if (pieces.empty()) pieces.emplace_back();  // chat: the role before any text
          for (const Piece& p : pieces) {
            batch += "data: ";
            batch += chunk(g, p, *first, nullptr).dump();
            batch += "\n\n";
            *first = false;
          }
          if (!sink.write(batch.data(), batch.size())) return cancel();
        } else if (!done) {
          // Silence while queued or prefilling: an SSE comment both keeps proxies
          // from timing out and finds a client that went away.
          static const char kKeepAlive[] = ": keep-alive\n\n";
          if (!sink.write(kKeepAlive, sizeof kKeepAlive - 1)) return cancel();
        }
        if (!done) return true;
        if (g.out->reason == FinishReason::Error) {
          event(error_json(ApiError(500, "generation failed: " + g.out->error, "", "server_error", "engine_error")));
        } else {
          const FinishReason fin = g.out->reason;
          if (!event(chunk(g, Piece{}, *first, &fin))) return cancel();
        }
        static const char kDone[] = "data: [DONE]\n\n";
        sink.write(kDone, sizeof kDone - 1);
        sink.done();
        return true;
      },
      [job, sc, inflight](bool) {
        job->cancelled = true;  // no-op when it already finished
        sc->wake();
        --*inflight;
      });
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat_endpoint) {
  if (draining) {
    metrics.rejected("draining");
    throw ApiError(503, "server is shutting down", "", "server_error", "draining");
  }
  if (!lm.tokenizer) throw ApiError(400, "the model has no tokenizer to decode generated text", "");
  const json body = parse_body(req.body);
  std::vector<int32_t> prompt;
  GenParams gp;
  std::string model, echo_text;
  if (chat_endpoint) {
    ChatRequest r = parse_chat(body, opt.cache_defaults, lm.model->config().vocab_size);
    if (!chat) throw ApiError(400, "messages: model has no chat template (start the server with --chat-template FILE)",
                              "messages", "invalid_request_error", "no_chat_template");
    prompt = lm.tokenizer->encode(chat(r.messages), false);
    if (prompt.empty()) throw ApiError(400, "messages: the chat template rendered an empty prompt", "messages");
    gp = r.gen;
    model = r.model;
  } else {
    CompletionRequest r = parse_completion(body, opt.cache_defaults, lm.model->config().vocab_size);
    prompt = completion_prompt(r);
    gp = r.gen;
    model = r.model;
    if (gp.echo) {
      if (const auto* text = std::get_if<std::string>(&r.prompt)) echo_text = *text;
      else echo_text = lm.tokenizer->decode(prompt, true);
    }
  }
  Generation g = submit(std::move(prompt), gp, chat_endpoint, model, echo_text);
  ++owner.in_flight_;
  if (gp.stream) return stream(res, std::move(g));
  std::unique_lock lk(g.out->mu);
  g.out->cv.wait(lk, [&] { return g.out->done; });
  std::string text;
  std::vector<TokenEntry> tokens;
  for (Piece& p : g.out->pending) {
    text += p.text;
    for (TokenEntry& t : p.tokens) tokens.push_back(std::move(t));
  }
  lk.unlock();
  --owner.in_flight_;
  if (g.out->reason == FinishReason::Error)
    throw ApiError(500, "generation failed: " + g.out->error, "", "server_error", "engine_error");
  send_json(res, 200, final_body(g, text, tokens));
}

namespace {
// Wraps a handler: ApiError -> its JSON, ptllm::Error -> 400, anything else -> 500.
// With `m`, a 400 counts as a request rejected as invalid.
template <typename F>
httplib::Server::Handler guarded(F f, Metrics* m = nullptr) {
  return [f, m](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      if (m && e.status == 400 && e.code != "kv_budget_exceeded") m->rejected("invalid");
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, e.what()));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"));
    }
  };
}
}  // namespace

void HttpServer::Impl::routes() {
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return authorised(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                : httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib produces itself (no route, body over the limit) get the OpenAI shape too.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404)
      send_error(res, ApiError(404, fmt::format("no route {} {}", req.method, req.path), "", "invalid_request_error",
                               "not_found"));
    else if (res.status == 413 && (metrics.rejected("invalid"), true))
      send_error(res, ApiError(413, fmt::format("request body larger than the server's limit of {} bytes (--max-body)",
                                                opt.max_body), "", "invalid_request_error", "body_too_large"));
    else
      send_error(res, ApiError(res.status, fmt::format("HTTP {}", res.status)));
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.Post("/v1/completions", guarded([this](const auto& req, auto& res) { generate(req, res, false); }, &metrics));
  svr.Post("/v1/chat/completions",
           guarded([this](const auto& req, auto& res) { generate(req, res, true); }, &metrics));
  svr.Get("/v1/models", guarded([this](const auto&, auto& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", opt.model_name},
                                      {"object", "model"},
                                      {"created", unix_now()},
                                      {"owned_by", "posttrainllm"},
                                      {"context_length", backend.context_length()}}})}});
  }));
  svr.Get("/health", guarded([this](const auto&, auto& res) {
    if (draining)
      send_json(res, 503, {{"status", "draining"}});
    else
      send_json(res, 200, {{"status", "ok"}});
  }));
  svr.Get("/metrics", guarded([this](const auto&, auto& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  }));
  svr.Post("/tokenize", guarded([this](const auto& req, auto& res) {
    const json b = parse_body(req.body);
    auto c = b.find("content");
    if (c == b.end() || !c->is_string()) throw ApiError(400, "content: expected a string", "content");
    bool special = true;
    if (auto a = b.find("add_special"); a != b.end()) {
      if (!a->is_boolean()) throw ApiError(400, "add_special: expected true or false", "add_special");
      special = a->template get<bool>();
    }
    if (!lm.tokenizer) throw ApiError(400, "the model has no tokenizer");
    send_json(res, 200, {{"tokens", lm.tokenizer->encode(c->template get<std::string>(), special)}});
  }));
  svr.Post("/detokenize", guarded([this](const auto& req, auto& res) {
    const json b = parse_body(req.body);
    auto t = b.find("tokens");
    if (t == b.end() || !t->is_array()) throw ApiError(400, "tokens: expected an array of token ids", "tokens");
    std::vector<int32_t> ids;
    const int32_t vocab = lm.model->config().vocab_size;
    for (size_t i = 0; i < t->size(); ++i) {
      const json& v = (*t)[i];
      if (!v.is_number_integer() || v.template get<int64_t>() < 0 || v.template get<int64_t>() >= vocab)
        throw ApiError(400, fmt::format("tokens[{}]: expected a token id in [0, {})", i, vocab), "tokens");
      ids.push_back(v.template get<int32_t>());
    }
    if (!lm.tokenizer) throw ApiError(400, "the model has no tokenizer");
    send_json(res, 200, {{"content", lm.tokenizer->decode(ids)}});
  }));
}

HttpServer::HttpServer(ServerOptions opt, const LoadedModel& lm, Backend& backend, Scheduler& sched,
                       Metrics& metrics, ChatRenderer chat)
    : impl_(std::make_unique<Impl>(std::move(opt), lm, backend, sched, metrics, std::move(chat), *this)) {
  auto& svr = impl_->svr;
  const int threads = std::max(4, impl_->opt.http_threads);
  // Every open connection (a stream) holds a thread; the rest wait in the pool's
  // queue, which is unbounded, so many connections queue rather than fail.
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_payload_max_length(impl_->opt.max_body);
  svr.set_tcp_nodelay(true);  // SSE events are small writes: Nagle + delayed ACK would hold each up to 40 ms
  // Idle keep-alive connections give their thread back soon. The timeout is also
  // announced in a Keep-Alive header: a client that does not know it keeps an idle
  // connection longer (Node's fetch: 4 s) and may send a request on it just as the
  // server closes it ("other side closed", seen once in a soak). Node's fetch
  // (undici) reads the hint and closes an idle connection before the server does.
  constexpr int kKeepAliveSeconds = 2;
  svr.set_keep_alive_timeout(kKeepAliveSeconds);
  svr.set_default_headers({{"Keep-Alive", "timeout=" + std::to_string(kKeepAliveSeconds)}});
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  impl_->routes();
}

HttpServer::~HttpServer() = default;

namespace {

// cpp-httplib (Debian's 0.11 is a compiled library) listens with a backlog of
// 5: a burst of connections (the 1,000-connection fault test) overflows the
// accept queue, the kernel drops handshakes (clients retry after 1, 3, 7 ... s)
// and resets some connections. A listening socket may be listened on again
// with a larger backlog; the library does not expose its descriptor, so it is
// found by its local port.
void widen_listen_backlog(int port) {
  for (int fd = 0; fd < 4096; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) continue;
    int p = -1;
    if (ss.ss_family == AF_INET) p = ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) p = ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
    if (p == port) ::listen(fd, SOMAXCONN);
  }
}

}  // namespace

int HttpServer::bind() {
  auto& o = impl_->opt;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->svr.bind_to_any_port(o.host);
    if (port < 0) fail("--host {}: cannot bind a port", o.host);
  } else if (!impl_->svr.bind_to_port(o.host, o.port)) {
    fail("--host {} --port {}: cannot bind (in use, or not an address of this machine)", o.host, o.port);
  }
  widen_listen_backlog(port);
  return port;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }
void HttpServer::stop() { impl_->svr.stop(); }
void HttpServer::begin_drain() {
  impl_->draining = true;
  impl_->sched.drain();
}

}  // namespace ptllm::serve
