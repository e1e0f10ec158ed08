// Unit tests of the Jinja engine, feature by feature. Expected strings follow
// from Jinja's semantics with HF's settings (trim_blocks, lstrip_blocks) and
// HF's printing (true/false lower-case, none prints as nothing).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "serve/jinja.h"

using ptllm::jinja::RenderError;
using ptllm::jinja::Template;
using ptllm::jinja::TemplateRaised;
using json = nlohmann::ordered_json;

namespace {

std::string render(const std::string& src, const json& ctx = json::object()) {
  return Template(src, "t").render(ctx);
}

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(render("hello"), "hello");
  EXPECT_EQ(render("a{{ 1 + 2 }}b"), "a3b");
  EXPECT_EQ(render("{{ 'x' ~ 1 ~ true }}"), "x1true");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 3.5 1024");
  EXPECT_EQ(render("{{ 1.0 }} {{ 2.5 * 2 }} {{ 0.1 + 0.2 }}"), "1.0 5.0 0.30000000000000004");
  EXPECT_EQ(render("{{ none }}|{{ undefined_thing }}|{{ true }}"), "||true");
  EXPECT_EQ(render("{{ 'a' + 'b' }}{{ [1] + [2] }}"), "ab[1, 2]");
  EXPECT_EQ(render("{# comment #}x{{ \"q\\n\" }}"), "xq\n");
}

TEST(Jinja, Variables) {
  json ctx = {{"user", {{"name", "Ann"}, {"tags", {"a", "b"}}}}};
  EXPECT_EQ(render("{{ user.name }} {{ user['name'] }} {{ user.tags[1] }} {{ user.tags[-1] }}", ctx), "Ann Ann b b");
  EXPECT_EQ(render("[{{ user.missing }}][{{ user.missing.deeper }}]", ctx), "[][]");
}

TEST(Jinja, Comparisons) {
  EXPECT_EQ(render("{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' == 'a' }} {{ 1 != 1 }} {{ 1 == 1.0 }}"), "true false true false true");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"),
            "true true true true");
  EXPECT_EQ(render("{{ not 1 == 2 }} {{ x is not defined and not y }}"), "true true");
  EXPECT_EQ(render("{{ 0 or 'fallback' }} {{ 'x' and 'y' }}"), "fallback y");
}

TEST(Jinja, IfElifElse) {
  const char* t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(t, {{"n", 1}}), "one");
  EXPECT_EQ(render(t, {{"n", 2}}), "two");
  EXPECT_EQ(render(t, {{"n", 5}}), "many");
  EXPECT_EQ(render("{{ 'y' if x else 'n' }}{{ 'z' if x }}", {{"x", false}}), "n");
}

TEST(Jinja, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }};{% endfor %}",
                   {{"xs", {"a", "b"}}}),
            "102truefalse2;211falsetrue2;");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }} {% endfor %}", {{"xs", {1, 2, 3}}}),
            ">1<2 1>2<3 2>3< ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}), "a=1,b=2,");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"z", 1}, {"a", 2}}}}), "za");
  EXPECT_EQ(render("{% for x in range(5) if x is odd %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(render("{% for x in range(9) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
                   "{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
                   {{"xs", {1, 2}}}),
            "121|122|");
}

TEST(Jinja, SetAndScopes) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.a = 'v' %}{{ ns.a }}"), "v");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set block %}  inner {{ 1 }}{% endset %}[{{ block }}]"), "[  inner 1]");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true %}\nb{% endif %}"), "ab");
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
  EXPECT_EQ(render("{% if true %}\n    x\n    {% endif %}\ny"), "    x\ny");
  EXPECT_EQ(render("{# c #}\nz"), "z");
  EXPECT_EQ(render("{{ 'v' }}\nw"), "v\nw");  // not after an expression
  EXPECT_EQ(render("line\n"), "line");        // one trailing newline dropped
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render("{{ '  x  ' | trim }}|{{ 'Ab' | lower }}{{ 'Ab' | upper }}|{{ 'hello world' | title }}"
                   "|{{ 'hi there' | capitalize }}"),
            "x|abAB|Hello World|Hi there");
  EXPECT_EQ(render("{{ [1, 2, 3] | length }}{{ 'héllo' | length }}{{ {'a': 1} | length }}{{ [1,2] | count }}"), "3512");
  EXPECT_EQ(render("{{ [1, 2, 3] | join(', ') }}|{{ ['a', 'b'] | join }}|{{ [3, 1] | first }}{{ [3, 1] | last }}"),
            "1, 2, 3|ab|31");
  EXPECT_EQ(render("{{ [1, 2] | reverse | list }}{{ 'aXbX' | replace('X', '-') }}{{ x | default('d') }}"
                   "{{ '' | default('e', true) }}{{ '' | default('f') }}",
                   json::object()),
            "[2, 1]a-b-de");
  EXPECT_EQ(render("{{ '42' | int + 1 }} {{ 3.9 | int }} {{ 'x' | int }} {{ 5 | string ~ '!' }} {{ 'a' | safe }}"),
            "43 3 0 5! a");
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}"
                   "{% for k, v in {'x': 1} | items %}{{ k }}{{ v }}{% endfor %}"),
            "a2b1x1");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | join }}{{ [1, 1, 2] | unique | join }}"), "12312");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, first=true) }}"), "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}"), "ABCD");
}

TEST(Jinja, SelectMap) {
  json ctx = {{"ms", {{{"role", "user"}, {"n", 1}}, {{"role", "bot"}, {"n", 2}}, {{"role", "user"}}}}};
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | list | length }}", ctx), "2");
  EXPECT_EQ(render("{{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='n') | join }}", ctx), "2");
  EXPECT_EQ(render("{{ ms | selectattr('n') | map(attribute='role') | join(',') }}", ctx), "user,bot");
  EXPECT_EQ(render("{{ ms | selectattr('n', 'defined') | list | length }}", ctx), "2");
  EXPECT_EQ(render("{{ ms | map(attribute='n', default=0) | join }}", ctx), "120");
}

TEST(Jinja, ToJson) {
  json ctx = {{"v", {{"name", "f"}, {"args", {1, "two", nullptr, true}}, {"empty", json::object()}}}};
  EXPECT_EQ(render("{{ v | tojson }}", ctx), R"({"name": "f", "args": [1, "two", null, true], "empty": {}})");
  EXPECT_EQ(render("{{ v | tojson(indent=2) }}", ctx),
            "{\n  \"name\": \"f\",\n  \"args\": [\n    1,\n    \"two\",\n    null,\n    true\n  ],\n  \"empty\": {}\n}");
  EXPECT_EQ(render(R"({{ 'é"\\\n' | tojson }})"), R"("é\"\\\n")");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}"), R"({"a": 2, "b": 1})");
  EXPECT_EQ(render("{{ 'é' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\"");
}

TEST(Jinja, Tests) {
  json ctx = {{"s", "x"}, {"n", 1}, {"f", 1.5}, {"l", {1}}, {"d", {{"a", 1}}}, {"z", nullptr}, {"b", false}};
  EXPECT_EQ(render("{{ s is string }}{{ n is number }}{{ f is number }}{{ n is integer }}{{ l is iterable }}"
                   "{{ s is iterable }}{{ d is mapping }}{{ l is mapping }}{{ z is none }}{{ b is false }}"
                   "{{ b is true }}{{ q is undefined }}{{ s is defined }}{{ l is sequence }}{{ 3 is odd }}{{ 4 is even }}",
                   ctx),
            "truetruetruetruetruetruetruefalsetruetruefalsetruetruetruetruetrue");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(render("{{ ' a '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\n\na'.lstrip('\n') }}|{{ 'a  '.rstrip() }}"),
            "a|a|a|a");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') | length }}{{ ' a  b '.split() | join('|') }}{{ 'a-b-c'.split('-', 1)[1] }}"),
            "4a|bb-c");
  EXPECT_EQ(render("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"),
            "truetrueABab");
  EXPECT_EQ(render("{{ 'a b'.title() }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'x'.length }}"), "A Bbba1");
  EXPECT_EQ(render("{{ '</think>'.join(['a', 'b']) }}"), "a</think>b");
}

TEST(Jinja, DictMethods) {
  json ctx = {{"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.get('z') is none }}", ctx), "1dflttrue");
  EXPECT_EQ(render("{{ d.keys() | join }}{{ d.values() | join }}{% for k, v in d.items() %}{{ k }}{% endfor %}", ctx),
            "ab12ab");
}

TEST(Jinja, Slices) {
  json ctx = {{"xs", {0, 1, 2, 3, 4}}};
  EXPECT_EQ(render("{{ xs[1:3] }}{{ xs[::-1] }}{{ xs[:-1] | length }}{{ xs[::2] }}{{ xs[3:] }}{{ xs[-2:] }}", ctx),
            "[1, 2][4, 3, 2, 1, 0]4[0, 2, 4][3, 4][3, 4]");
  EXPECT_EQ(render("{{ 'hello'[1:3] }}{{ 'hello'[::-1] }}{{ 'hello'[-1] }}{{ '{\"a\": 1}'[:-1] }}"), "elolleho{\"a\": 1");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}"),
            "Hi A! Hi B? Hi C.");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
  EXPECT_EQ(render("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}in{% endcall %}"), "[in]");
  EXPECT_THROW(render("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"), RenderError);
}

TEST(Jinja, DictAndListLiterals) {
  EXPECT_EQ(render("{% set m = {'string': 'str', 'n': 1} %}{{ m['string'] }}{{ m.n }}{{ m['missing'] is defined }}"),
            "str1false");
  EXPECT_EQ(render("{% for a, b in [('x', 1), ('y', 2)] %}{{ a }}{{ b }}{% endfor %}"), "x1y2");
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), R"({"a": {"b": 1}})");
}

TEST(Jinja, StrftimeNowUsesInjectedClock) {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  Template tpl("{{ strftime_now('%d %b %Y') }}", "t");
  EXPECT_EQ(tpl.render(json::object(), [t] { return t; }), "26 Jul 2024");
}

TEST(Jinja, RaiseExceptionIsTyped) {
  try {
    render("ok{{ raise_exception('Roles must alternate') }}");
    FAIL() << "no exception";
  } catch (const TemplateRaised& e) {
    EXPECT_EQ(e.raised_message, "Roles must alternate");
    EXPECT_NE(std::string(e.what()).find("t:1:6"), std::string::npos) << e.what();
  }
}

TEST(Jinja, ErrorsNameTemplateAndPosition) {
  auto message = [](const std::string& src, const json& ctx = json::object()) -> std::string {
    try {
      Template(src, "tpl.jinja").render(ctx);
    } catch (const TemplateRaised&) {
      return "raised";
    } catch (const RenderError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message("a\n{% if x %}"), "tpl.jinja:2:4: 'if' block is never closed");
  EXPECT_EQ(message("{{ 'abc }}"), "tpl.jinja:1:4: string literal is never closed");
  EXPECT_EQ(message("{% bogus %}"), "tpl.jinja:1:4: unknown statement 'bogus'");
  EXPECT_EQ(message("x\n  {{ 1 + none }}"), "tpl.jinja:2:8: cannot apply '+' to none");
  EXPECT_EQ(message("{{ x | nosuch }}"), "tpl.jinja:1:6: unknown filter 'nosuch'");
  EXPECT_EQ(message("{{ u | trim }}"), "tpl.jinja:1:6: filter 'trim' needs a string, got undefined");
  EXPECT_EQ(message("{% for x in 5 %}{% endfor %}"), "tpl.jinja:1:13: for loop needs a list or dict, got integer");
  EXPECT_EQ(message("{{ 1 / 0 }}"), "tpl.jinja:1:6: division by zero");
  EXPECT_EQ(message("{{ (((1 }}"), "tpl.jinja:1:9: expected ')', got '}}'");
  // Values stay acyclic (a cycle would leak): a namespace cannot hold itself.
  EXPECT_EQ(message("{% set ns = namespace() %}{% set ns.me = [1, {'x': ns}] %}"),
            "tpl.jinja:1:30: cannot store a namespace inside itself");
  EXPECT_EQ(message("{% set ns = namespace() %}{% set d = {'n': ns} %}{% set ns.g = d.get %}"),
            "tpl.jinja:1:53: cannot store a function in a namespace");
  EXPECT_NE(message("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("too deeply"), std::string::npos);
  json deep = json::array();
  for (int i = 0; i < 600; ++i) deep = json::array({deep});
  EXPECT_NE(message("{{ x }}", {{"x", deep}}).find("too deeply"), std::string::npos);
  // Runaway recursion is an error, not a stack overflow.
  EXPECT_NE(message("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("too deeply"), std::string::npos);
}

}  // namespace

namespace {

// Bad templates fail with a RenderError, never a crash, hang or another
// exception type: every 23rd prefix of each real template, and single-byte
// corruptions with Jinja's syntax characters, are parsed and rendered.
TEST(JinjaRobustness, TruncatedAndCorruptedTemplatesFailCleanly) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(PTLLM_SHARED_DIR) / "anchors/llama.cpp/templates";
  json ctx = json::parse(R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"}], "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}]})");
  size_t files = 0, attempts = 0, rendered = 0;
  auto attempt = [&](const std::string& src) {
    ++attempts;
    try {
      Template(src, "fuzz").render(ctx);
      ++rendered;
    } catch (const RenderError&) {
    }  // any other exception type escapes and fails the test
  };
  const std::string syntax = "{}%#-+'\"()[]|.,:=~ \n";
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream f(entry.path());
    std::string src((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(src.empty()) << entry.path();
    ++files;
    for (size_t cut = 0; cut < src.size(); cut += 23) attempt(src.substr(0, cut));
    for (size_t i = 0; i < src.size(); i += 37) {
      std::string bad = src;
      bad[i] = syntax[(i / 37) % syntax.size()];
      attempt(bad);
    }
  }
  EXPECT_EQ(files, 17u);
  EXPECT_GT(rendered, attempts / 20);  // some corruptions still render (inside text)
  std::printf("%zu templates: %zu attempts, %zu rendered, the rest failed cleanly\n", files, attempts, rendered);
}

}  // namespace
