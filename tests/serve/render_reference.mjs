// Renders every chat template under test with @huggingface/jinja (the
// renderer of transformers.js and the Hub) on a fixed set of conversations and
// writes what it produced — text, or the error it raised — as JSON for
// chat_template_test to compare against, string for string.
//
//   node render_reference.mjs SHARED_DIR NODE_MODULES_DIR OUT.json
//
// Templates: the chat_template of every tokenizer_config.json under
// SHARED_DIR/fixtures/tokenizers, and every SHARED_DIR/anchors/llama.cpp/templates/*.jinja.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [sharedDir, modulesDir, outPath] = process.argv.slice(2);
if (!sharedDir || !modulesDir || !outPath) {
  console.error("usage: node render_reference.mjs SHARED_DIR NODE_MODULES_DIR OUT.json");
  process.exit(2);
}
const jinjaPkg = path.join(modulesDir, "@huggingface", "jinja");
if (!fs.existsSync(path.join(jinjaPkg, "package.json"))) {
  console.error(`${jinjaPkg}: @huggingface/jinja is not installed (run npm ci in tools/anchors)`);
  process.exit(1);
}
const pkg = JSON.parse(fs.readFileSync(path.join(jinjaPkg, "package.json"), "utf8"));
const { Template } = await import(pathToFileURL(path.join(jinjaPkg, pkg.module ?? pkg.main)).href);

// strftime_now reads `new Date()`: pin the clock to 26 Jul 2024 12:00 local
// time, the same instant chat_template_test gives our engine.
const RealDate = Date;
const FIXED = new RealDate(2024, 6, 26, 12, 0, 0).getTime();
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(FIXED);
    else super(...args);
  }
  static now() {
    return FIXED;
  }
};

// Special tokens of the .jinja templates' models (their tokenizer_config.json).
const TOKENS = [
  [/^CohereForAI/, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"],
  [/^NousResearch/, "<|begin_of_text|>", "<|im_end|>"],
  [/^Qwen/, "", "<|im_end|>"],
  [/deepseek/, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
  [/^(fireworks|meetkai|meta-llama)/, "<|begin_of_text|>", "<|eot_id|>"],
  [/^google-gemma/, "<bos>", "<eos>"],
  [/^microsoft-Phi/, "<s>", "<|endoftext|>"],
  [/^mistralai/, "<s>", "</s>"],
];

function tokenString(v) {
  if (v === undefined || v === null) return "";
  return typeof v === "string" ? v : (v.content ?? "");
}

const templates = [];
const tokDir = path.join(sharedDir, "fixtures", "tokenizers");
for (const name of fs.readdirSync(tokDir).sort()) {
  const cfgPath = path.join(tokDir, name, "tokenizer_config.json");
  if (!fs.existsSync(cfgPath)) continue;
  const cfg = JSON.parse(fs.readFileSync(cfgPath, "utf8"));
  let source = cfg.chat_template;
  if (Array.isArray(source)) source = source.find((t) => t.name === "default")?.template;
  if (typeof source !== "string") continue;
  templates.push({ id: `fixtures/tokenizers/${name}`, tokenizer_config: cfgPath, source,
                   bos: tokenString(cfg.bos_token), eos: tokenString(cfg.eos_token) });
}
const tplDir = path.join(sharedDir, "anchors", "llama.cpp", "templates");
for (const file of fs.readdirSync(tplDir).sort()) {
  if (!file.endsWith(".jinja")) continue;
  const tok = TOKENS.find(([re]) => re.test(file));
  if (!tok) throw new Error(`${file}: no special tokens known for this template`);
  templates.push({ id: `anchors/llama.cpp/templates/${file}`, source: fs.readFileSync(path.join(tplDir, file), "utf8"),
                   bos: tok[1], eos: tok[2] });
}

const sys = { role: "system", content: "You are a helpful assistant." };
const u1 = { role: "user", content: "Hello! What is 2+2?" };
const a1 = { role: "assistant", content: "2+2 is 4." };
const u2 = { role: "user", content: "And 3+3?" };
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather for a city.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"], description: "Temperature unit" },
      },
      required: ["city"],
    },
  },
}];
const weatherQ = { role: "user", content: "What's the weather in Paris?" };
const toolCall = { role: "assistant", content: null, tool_calls: [{
  id: "call12345", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] };
const toolResult = { role: "tool", tool_call_id: "call12345", name: "get_weather", content: '{"temperature": 21}' };

const objectArgsCall = { role: "assistant", content: null, tool_calls: [{
  id: "call12345", type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "celsius" } } }] };
const parallelCalls = { role: "assistant", content: "Checking both.", tool_calls: [
  { id: "call00001", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
  { id: "call00002", type: "function", function: { name: "get_weather", arguments: '{"city": "Rome"}' } }] };
const nestedTools = [{
  type: "function",
  function: {
    name: "book_trip",
    description: "Book a trip",
    parameters: {
      type: "object",
      properties: {
        traveler: { type: "object", description: "Who travels", properties: { name: { type: "string" }, age: { type: "integer" } },
                    required: ["name"] },
        stops: { type: "array", items: { type: "string" }, description: "Cities" },
        budget: { type: ["number", "null"], description: "Max spend" },
      },
      required: ["traveler"],
    },
  },
}];
const a2 = { role: "assistant", content: "3+3 is 6." };
const u3 = { role: "user", content: "Thanks. Bye!" };

const conversations = [
  { name: "user", messages: [u1] },
  { name: "system_user", messages: [sys, u1] },
  { name: "multi_turn", messages: [sys, u1, a1, u2] },
  { name: "multi_turn_no_system", messages: [u1, a1, u2] },
  { name: "ends_with_assistant", messages: [u1, a1] },
  { name: "whitespace", messages: [{ role: "user", content: "  padded text \n\n" }] },
  { name: "unicode_and_escapes", messages: [{ role: "user", content: 'Grüße, 你好 — "quoted" \\ back\ttab\nline' }] },
  { name: "thinking_in_content", messages: [u1, { role: "assistant", content: "<think>\nLet me add.\n</think>\n\n2+2 is 4." }, u2] },
  { name: "reasoning_content", messages: [u1, { role: "assistant", content: "2+2 is 4.", reasoning_content: "Adding two and two." }, u2] },
  { name: "enable_thinking_false", messages: [u1], extra: { enable_thinking: false } },
  { name: "roles_not_alternating", messages: [u1, u2] },
  { name: "tools", messages: [sys, weatherQ], extra: { tools } },
  { name: "tools_no_system", messages: [weatherQ], extra: { tools } },
  { name: "tool_call_roundtrip", messages: [sys, weatherQ, toolCall, toolResult], extra: { tools } },
  { name: "template_variables", messages: [u1],
    extra: { functions: JSON.stringify(tools.map((t) => t.function)), datetime: "2024-07-26", date_string: "1 Jan 2025" } },
  { name: "empty", messages: [] },
  { name: "system_only", messages: [sys] },
  { name: "assistant_first", messages: [a1, u1] },
  { name: "long_multi_turn", messages: [sys, u1, a1, u2, a2, u3] },
  { name: "tool_call_object_arguments", messages: [weatherQ, objectArgsCall, toolResult], extra: { tools } },
  { name: "parallel_tool_calls", messages: [weatherQ, parallelCalls,
      { role: "tool", tool_call_id: "call00001", content: "18" }, { role: "tool", tool_call_id: "call00002", content: "25" }],
    extra: { tools } },
  { name: "tools_nested_parameters", messages: [sys, u1], extra: { tools: nestedTools } },
];

const cases = [];
for (const t of templates) {
  let tpl = null, parseError = null;
  try {
    tpl = new Template(t.source);
  } catch (e) {
    parseError = String(e.message ?? e);
  }
  for (const c of conversations) {
    for (const agp of [true, false]) {
      const ctx = { ...(c.extra ?? {}), messages: c.messages, add_generation_prompt: agp,
                    bos_token: t.bos, eos_token: t.eos };
      const rec = { template: t.id, conversation: c.name, add_generation_prompt: agp,
                    messages: c.messages, extra: c.extra ?? {} };
      if (parseError) {
        rec.error = parseError;
      } else {
        try {
          rec.output = tpl.render(ctx);
        } catch (e) {
          rec.error = String(e.message ?? e);
        }
      }
      cases.push(rec);
    }
  }
}

// Small templates, one feature each, rendered with `data` as context.
// (Not here: str.strip('x') with a character set, which HF ignores and
// jinja2 honours; 'abc' | list, which HF rejects. We follow jinja2.)
const data = {
  xs: [3, 1, 2], names: ["b", "A", "c"], s: "  Mixed Case text  ", n: 7, f: 2.5, t: true, z: null,
  d: { b: 1, a: [1, 2], c: { x: "y" } }, ms: [{ role: "user", n: 1 }, { role: "bot", n: 2 }, { role: "user" }],
  uni: "héllo wörld", nested: { list: [{ k: "v1" }, { k: "v2" }] },
};
const snippetSources = [
  "a  {{- 'b' -}}  c", "x\n  {%- if t %}\ny{% endif %}\n", "{% if t %}\n    in\n    {% endif %}\nout",
  "  {# c #}\nz", "{{ 'v' }}\nw", "a {#- c -#}\n b", "{% for x in xs %}\n  {{ x }}\n{% endfor %}",
  "{%- for x in xs -%}\n  [{{ x }}]  \n{%- endfor -%}", "text\n\n",
  "{{ xs }}{{ d }}{{ t }}{{ z }}{{ f }}{{ n / 2 }}{{ 4 / 2 }}{{ 0.5 if false else 10 // 3 }}",
  "{{ xs | sort | join(',') }} {{ names | sort | join }} {{ xs | reverse | list }} {{ xs | length }}",
  "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ 'abc' | capitalize }}|{{ s | length }}",
  "{{ uni | length }} {{ uni[1] }} {{ uni[::-1] }} {{ uni.upper() }} {{ uni | tojson }} {{ uni | tojson(ensure_ascii=true) }}",
  "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(indent=4, sort_keys=true) }}|{{ xs | tojson(separators=(',', ':')) }}",
  "{{ ms | selectattr('role', 'equalto', 'user') | list | length }}{{ ms | rejectattr('n') | list | tojson }}{{ ms | map(attribute='role') | join('/') }}",
  "{{ ms | selectattr('n', 'defined') | map(attribute='n') | list }} {{ ms | map(attribute='n', default=0) | list }}",
  "{{ nested.list | map(attribute='k') | join }} {{ nested.list[-1].k }} {{ nested['list'][0]['k'] }}",
  "{% for k, v in d.items() %}{{ k }}:{{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d | dictsort %}{{ k }}{% endfor %}",
  "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}|{% endfor %}",
  "{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% else %}none{% endfor %}{% for x in [] %}{% else %}empty{% endfor %}",
  "{% for x in range(10) %}{% if x is even %}{% continue %}{% endif %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}",
  "{% set ns = namespace(total=0, seen=[]) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% set ns.seen = ns.seen + [x] %}{% endfor %}{{ ns.total }}{{ ns.seen }}",
  "{% set x = 1 %}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }}{% if t %}{% set y = 2 %}{% endif %}{{ y }}",
  "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set block %}B{{ n }}{% endset %}{{ block }}",
  "{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='y') }}{{ m(a=5) }}",
  "{% macro rec(k) %}{% if k > 0 %}{{ k }},{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
  "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ n }}{% endcall %}",
  "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each(xs) %}[{{ x }}]{% endcall %}",
  "{% macro v(a) %}{{ a }}{{ varargs | length }}{{ kwargs | tojson }}{% endmacro %}{{ v(1, 2, 3, k='w') }}",
  "{% filter upper %}up {{ s }}{% endfilter %}{% filter trim %}  pad  {% endfilter %}|",
  "{{ 'a' ~ n ~ t ~ f }} {{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ n * 2 }} {{ n - 10 }} {{ -n }} {{ n % 3 }} {{ -7 // 2 }} {{ 2 ** 8 }}",
  "{{ 1 < 2 }}{{ 2 <= 2 }}{{ 3 > 4 }}{{ n == 7 }}{{ n != 7 }}{{ 'a' in 'cat' }}{{ 2 in xs }}{{ 'a' in d }}{{ 9 not in xs }}{{ not t }}",
  "{{ z is none }}{{ q is undefined }}{{ q is defined }}{{ s is string }}{{ n is number }}{{ f is number }}{{ n is integer }}{{ xs is iterable }}{{ d is mapping }}{{ xs is sequence }}{{ t is true }}{{ t is false }}{{ t is boolean }}",
  "{{ q or 'dflt' }} {{ q | default('d1') }} {{ '' | default('d2', true) }} {{ z or 'nn' }} {{ 0 and 1 }} {{ 'x' if q is defined else 'y' }}",
  "{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ xs[::2] }}{{ xs[::-1] }}{{ 'abcdef'[1:4] }}{{ 'abcdef'[-2:] }}{{ xs[5] }}",
  "{{ ' a b '.strip() }}|{{ '\\n\\nhi\\n'.strip('\\n') }}|{{ 'a,b,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'hey'.startswith('he') }}{{ 'hey'.endswith('y') }}|{{ 'aaa'.replace('a', 'b') }}|{{ 'ab'.title() }}",
  "{{ d.get('b') }}{{ d.get('zz', 'dv') }}{{ d.get('zz') }}{{ d.keys() | list }}{{ d.values() | list | length }}{{ d.items() | list | length }}",
  "{{ '12' | int + 1 }}{{ '3.5' | float }}{{ f | int }}{{ n | string }}{{ xs | string }}{{ t | string }}{{ 'z' | safe }}{{ -3 | abs }}",
  "{{ xs | first }}{{ xs | last }}{{ [1, 1, 2, 1] | unique | list }}{{ names | join(', ') }}",
  "{{ 'line1\nline2\n\nline4' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width=3, first=true, blank=true) }}",
  "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}{{ 'yes' if t }}{{ 'no' if not t }}",
  "{{ {'k': 'v', 'n': [1, {'m': none}]} | tojson }}{{ [] | tojson }}{{ {} | tojson(indent=2) }}",
  "{{ \"dq'\" ~ 'sq\\\"' ~ '\\u00e9\\x41\\t|' }}", "{{ strftime_now('%Y-%m-%d %H:%M %b %B') }}",
  "{{ range(3) | list }}{{ range(1, 4) | list }}{{ range(10, 0, -3) | list }}",
  "{{ raise_exception('custom failure ' ~ n) }}", "{{ q.attr.deeper }}|{{ z.attr }}|{{ xs.length }}",
  "{{ q + 1 }}", "{{ z + 1 }}", "{{ s | nosuchfilter }}", "{% for x in n %}{% endfor %}", "{{ q | trim }}",
  "{% if %}", "{{ 1 + }}", "{% for x in xs %}", "{{ 'unterminated }}", "{% endif %}",
];
const snippets = snippetSources.map((source) => {
  const rec = { source };
  try {
    rec.output = new Template(source).render({ ...data });
  } catch (e) {
    rec.error = String(e.message ?? e);
  }
  return rec;
});

fs.writeFileSync(outPath, JSON.stringify({ renderer: `@huggingface/jinja ${pkg.version}`, templates, cases, data, snippets },
                                         null, 1));
const failed = cases.filter((c) => c.error !== undefined).length;
console.log(`${outPath}: ${templates.length} templates, ${cases.length} cases (${failed} raise an error)`);
