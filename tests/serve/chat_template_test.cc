// ChatTemplate against the reference: chat_template_reference.json is written
// by render_reference.mjs (@huggingface/jinja) in the ctest fixture that runs
// before this test; every case renders here and must give the same string, or
// an error where the reference raised one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "serve/chat_template.h"

using ptllm::serve::ChatTemplate;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

json load_reference() {
  std::ifstream f(PTLLM_CHAT_REFERENCE);
  if (!f) ADD_FAILURE() << PTLLM_CHAT_REFERENCE << ": missing (the chat_template_reference ctest fixture writes it)";
  return f ? json::parse(f) : json::object();
}

std::tm fixed_clock() {  // the instant render_reference.mjs pins: 26 Jul 2024 12:00
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 12;
  t.tm_wday = 5;
  t.tm_yday = 207;
  return t;
}

// Where @huggingface/jinja is known to depart from jinja2 (which the models'
// templates were written for, and transformers renders with), jinja2's result
// (render_jinja2.py) decides:
//  - HF fails where jinja2 renders: it cannot unpack its own tuple values
//    (`for a, b in [("x", "y")]`, functionary v3.2), has no string repetition
//    ("    " * depth), rejects `none | selectattr(...)` and `for x in undefined`
//    (jinja2: empty; functionary v3.1 without tools, Hermes/Command R);
//  - HF renders where jinja2 fails: 'text' + dict is a TypeError in Python,
//    HF prints JavaScript's "[object Map]" (tool-call arguments as an object).
bool departs_from_jinja2(const json& c) {
  if (c.contains("output")) return c["output"].get<std::string>().find("[object Map]") != std::string::npos;
  const std::string e = c["error"];
  for (const char* s : {"Cannot unpack non-iterable type: TupleValue", "Unknown operator \"*\" between StringValue and IntegerValue",
                        "Cannot apply filter \"selectattr\" to type: NullValue",
                        "Expected iterable or object type in for loop: got UndefinedValue"})
    if (e.find(s) != std::string::npos) return true;
  return false;
}

TEST(ChatTemplate, MatchesHuggingFaceJinjaOnRealTemplates) {
  json ref = load_reference();
  ASSERT_TRUE(ref.contains("cases"));
  std::map<std::string, ChatTemplate> templates;
  for (const auto& t : ref["templates"]) {
    ChatTemplate tpl(t["source"].get<std::string>(), {t["bos"].get<std::string>(), t["eos"].get<std::string>()},
                     t["id"].get<std::string>());
    tpl.set_clock(fixed_clock);
    templates.emplace(t["id"].get<std::string>(), std::move(tpl));
  }
  EXPECT_GE(templates.size(), 19u);  // 2 tokenizer fixtures + 17 llama.cpp templates
  size_t matched_text = 0, matched_error = 0, decided_by_jinja2 = 0;
  std::map<std::string, size_t> rendered_per_template;
  for (const auto& c : ref["cases"]) {
    const std::string id = c["template"];
    const std::string what = id + " / " + c["conversation"].get<std::string>() +
                             (c["add_generation_prompt"].get<bool>() ? " / add_generation_prompt" : "");
    std::string out, err;
    bool raised = false;
    try {
      out = templates.at(id).render(c["messages"], c["add_generation_prompt"], c["extra"]);
    } catch (const ptllm::jinja::TemplateRaised& e) {
      err = e.raised_message;
      raised = true;
    } catch (const ptllm::Error& e) {
      err = e.what();
    }
    if (departs_from_jinja2(c)) {
      ASSERT_TRUE(c.contains("jinja2_output") || c.contains("jinja2_error")) << "render_jinja2.py did not run";
      if (c.contains("jinja2_output")) {
        EXPECT_EQ(err, "") << what << " (decided by jinja2)";
        EXPECT_EQ(out, c["jinja2_output"].get<std::string>()) << what << " (decided by jinja2)";
      } else if (c["jinja2_error"].get<std::string>().rfind("UndefinedError", 0) != 0) {
        // (jinja2's UndefinedError for messages[0].role on [] is the one
        // strictness we do not copy: attributes of undefined are undefined, as in HF.)
        EXPECT_NE(err, "") << what << ": jinja2 fails (" << c["jinja2_error"].get<std::string>() << "), we rendered:\n" << out;
      }
      decided_by_jinja2 += 1;
    } else if (c.contains("output")) {
      EXPECT_TRUE(err.empty()) << what << ": reference rendered, we failed: " << err;
      EXPECT_EQ(out, c["output"].get<std::string>()) << what;
      matched_text += err.empty() && out == c["output"].get<std::string>();
      rendered_per_template[id] += err.empty();
    } else {
      const std::string ref_err = c["error"];
      EXPECT_FALSE(err.empty()) << what << ": reference raised \"" << ref_err << "\", we rendered:\n" << out;
      // raise_exception(msg): the reference's error message is msg itself.
      if (raised) {
        EXPECT_EQ(err, ref_err) << what;
      }
      matched_error += !err.empty();
    }
  }
  std::printf("matched %zu rendered texts and %zu errors of %zu cases; %zu decided by jinja2\n", matched_text,
              matched_error, ref["cases"].size(), decided_by_jinja2);
  // Every template renders at least one conversation (none is all errors).
  for (const auto& [id, tpl] : templates) EXPECT_GT(rendered_per_template[id], 0u) << id;
}

// One-feature templates (whitespace control, filters, tests, loops, macros,
// errors) rendered by the reference with its `data` context.
TEST(JinjaReference, SnippetsMatch) {
  json ref = load_reference();
  ASSERT_TRUE(ref.contains("snippets"));
  EXPECT_GE(ref["snippets"].size(), 50u);
  for (const auto& sn : ref["snippets"]) {
    const std::string src = sn["source"];
    std::string out, err;
    try {
      out = ptllm::jinja::Template(src, "snippet").render(ref["data"], fixed_clock);
    } catch (const ptllm::jinja::TemplateRaised& e) {
      err = e.raised_message;
    } catch (const ptllm::Error& e) {
      err = e.what();
    }
    if (sn.contains("output")) {
      EXPECT_EQ(err, "") << src;
      EXPECT_EQ(out, sn["output"].get<std::string>()) << src;
    } else {
      EXPECT_NE(err, "") << src << ": reference raised \"" << sn["error"].get<std::string>() << "\", we rendered " << out;
    }
  }
}

TEST(ChatTemplate, LoadsTemplateAndTokensFromTokenizerConfig) {
  json ref = load_reference();
  size_t loaded = 0;
  for (const auto& t : ref["templates"]) {
    if (!t.contains("tokenizer_config")) continue;
    auto tpl = ptllm::serve::chat_template_from_tokenizer_config(t["tokenizer_config"]);
    ASSERT_TRUE(tpl.has_value()) << t["id"];
    EXPECT_EQ(tpl->source(), t["source"].get<std::string>());
    EXPECT_EQ(tpl->tokens().bos, t["bos"].get<std::string>());
    EXPECT_EQ(tpl->tokens().eos, t["eos"].get<std::string>());
    ++loaded;
  }
  EXPECT_EQ(loaded, 2u);  // llama3 and qwen3; spm-bpe-32k has no template
  EXPECT_FALSE(ptllm::serve::chat_template_from_tokenizer_config(std::string(PTLLM_SHARED_DIR) +
                                                                 "/fixtures/tokenizers/spm-bpe-32k/tokenizer_config.json"));
}

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("ptllm_chat_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

TEST(ChatTemplate, ConfigForms) {
  TempDir dir;
  // The list form picks "default"; tokens may be {"content": ...} objects.
  dir.write("tokenizer_config.json", R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})");
  auto tpl = ptllm::serve::load_chat_template(dir.str());
  ASSERT_TRUE(tpl);
  EXPECT_EQ(tpl->render(json::parse(R"([{"role": "user", "content": "hi"}])"), false), "<s>hi</s>");
  // chat_template.jinja beside it wins, as in transformers.
  dir.write("chat_template.jinja", "J{{ messages | length }}");
  EXPECT_EQ(ptllm::serve::load_chat_template(dir.str())->render(json::array(), true), "J0");
  // --chat-template FILE overrides with the model's tokens.
  std::string override_path = dir.write("override.jinja", "{{ eos_token }}{% if add_generation_prompt %}>{% endif %}");
  EXPECT_EQ(ptllm::serve::chat_template_from_file(override_path, {"<s>", "</s>"}).render(json::array(), true), "</s>>");
}

TEST(ChatTemplate, MissingTemplateAndBadConfigs) {
  TempDir dir;
  dir.write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_FALSE(ptllm::serve::load_chat_template(dir.str()));
  auto message = [&](const std::string& text) -> std::string {
    std::string p = dir.write("tokenizer_config.json", text);
    try {
      ptllm::serve::chat_template_from_tokenizer_config(p);
    } catch (const ptllm::Error& e) {
      return std::string(e.what()).substr(p.size());
    }
    return "no error";
  };
  EXPECT_EQ(message("{nope").rfind(": not valid JSON", 0), 0u);
  EXPECT_EQ(message(R"({"chat_template": 5})"), ": chat_template must be a string or a list of {name, template}");
  EXPECT_EQ(message(R"({"chat_template": [{"name": "x", "template": "y"}]})"),
            ": chat_template list has no entry named \"default\"");
  EXPECT_EQ(message(R"({"chat_template": "x", "bos_token": 3})"), ": bos_token must be a string or {\"content\": string}");
  EXPECT_EQ(message(R"({"chat_template": "{% for %}"})").rfind(":1:", 0), 0u);  // names line:col of the template
  EXPECT_THROW(ptllm::serve::chat_template_from_file(dir.str() + "/absent.jinja", {}), ptllm::Error);
}

TEST(ChatTemplate, RenderArgumentsAreChecked) {
  ChatTemplate tpl("{{ messages | length }}{{ tools | length }}", {"", ""}, "t");
  EXPECT_EQ(tpl.render(json::array({{{"role", "user"}}}), true, {{"tools", json::array({1, 2})}}), "12");
  EXPECT_THROW(tpl.render(json::object(), true), ptllm::Error);
  EXPECT_THROW(tpl.render(json::array(), true, {{"messages", json::array()}}), ptllm::Error);
  EXPECT_THROW(tpl.render(json::array(), true), ptllm::Error);  // tools undefined: |length fails
}

}  // namespace

namespace {

// The server renders from several request threads with one ChatTemplate.
TEST(ChatTemplate, ConcurrentRendersAgree) {
  ChatTemplate tpl("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                   "<{{ m.role }}>{{ m.content | trim }}{% endfor %}{{ ns.n }}{{ bos_token }}",
                   {"<s>", "</s>"}, "t");
  json msgs = json::array();
  for (int i = 0; i < 50; ++i) msgs.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", " m" + std::to_string(i)}});
  const std::string want = tpl.render(msgs, true);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 50; ++r) bad[size_t(t)] += tpl.render(msgs, true) != want;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(4, 0));
  EXPECT_EQ(want.substr(want.size() - 5), "50<s>");
}

}  // namespace
