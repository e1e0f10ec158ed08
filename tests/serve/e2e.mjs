// End-to-end tests of `posttrainllm serve`: start the real server on a free
// loopback port and drive it over HTTP (fetch) and with the real `openai` npm
// client. Usage: node e2e.mjs GROUP  (openai | errors | disconnect | sigterm |
// batch | flagship | connections). Env: PTLLM_CLI (the executable), PTLLM_REPO_DIR,
// PTLLM_NODE_MODULES (a node_modules holding openai: tools/anchors/node_modules).
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import assert from 'node:assert/strict';

const CLI = process.env.PTLLM_CLI;
const REPO = process.env.PTLLM_REPO_DIR;
const NODE_MODULES = process.env.PTLLM_NODE_MODULES || `${REPO}/tools/anchors/node_modules`;
const STORIES = `${REPO}/models/stories260K`;
const SHARED = process.env.PTLLM_SHARED_DIR || `${REPO}/../shared`;
const PROMPT = 'Once upon a time';

// Starts the server; resolves once it prints its port. extra: more CLI flags.
function startServer(extra = [], model = STORIES) {
  return new Promise((resolve, reject) => {
    const proc = spawn(CLI, ['serve', model, '--port', '0', '--threads', '1', ...extra],
                       { env: { ...process.env, OMP_WAIT_POLICY: 'passive' }, stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 30000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.url) {
        clearTimeout(timer);
        proc.url = `http://127.0.0.1:${m[1]}`;
        proc.log = () => log;
        proc.exited = new Promise((res) => proc.on('exit', (code, sig) => res({ code, sig })));
        resolve(proc);
      }
    });
    proc.on('exit', (code) => { if (!proc.url) reject(new Error(`server exited ${code}:\n${log}`)); });
  });
}

async function stopServer(proc) {
  proc.kill('SIGTERM');
  const { code } = await proc.exited;
  assert.equal(code, 0, `server exit code after SIGTERM\n${proc.log()}`);
}

async function post(url, body, headers = {}) {
  const res = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers },
                                 body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* SSE or empty */ }
  return { status: res.status, text, json };
}

// Prometheus text -> { name{labels}: value }.
async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Parses an SSE body into the JSON of each data event; checks it ends with [DONE].
function sseEvents(text) {
  const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]', 'stream ends with data: [DONE]');
  return events.slice(0, -1).map((e) => JSON.parse(e));
}

function llama2cReference() {
  const ref = readFileSync(`${STORIES}/greedy_prompt_once_upon_a_time_n100.txt`, 'utf8');
  return ref.replace(/[ \n]+$/, '');
}

const groups = {

  // Chat with --chat-template (the bundled models ship none): the prompt is the
  // template rendered by @huggingface/jinja (the independent reference), so
  // usage.prompt_tokens must equal /tokenize of that text, and the greedy reply
  // must equal a plain completion of that text.
  async chat() {
    const require = createRequire(`${NODE_MODULES}/`);
    const { Template } = await import(require.resolve('@huggingface/jinja'));
    const OpenAI = require('openai').default ?? require('openai');
    const file = `${SHARED}/anchors/llama.cpp/templates/Qwen-Qwen2.5-7B-Instruct.jinja`;
    const srv = await startServer(['--chat-template', file]);
    try {
      const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0 });
      const messages = [{ role: 'system', content: 'You tell stories.' },
                        { role: 'user', content: 'Tell me about a cat.' }];
      const ref = new Template(readFileSync(file, 'utf8')).render({ messages, add_generation_prompt: true,
                                                                   bos_token: '<s>', eos_token: '</s>' });
      const t = await post(`${srv.url}/tokenize`, { content: ref, add_special: false });
      const c = await client.chat.completions.create({ model: 'x', messages, max_tokens: 24, temperature: 0,
                                                       ignore_eos: true });
      assert.equal(c.object, 'chat.completion');
      assert.equal(c.choices[0].message.role, 'assistant');
      assert.equal(c.usage.prompt_tokens, t.json.tokens.length, 'prompt = the reference rendering');
      assert.equal(c.usage.completion_tokens, 24);
      const plain = await post(`${srv.url}/v1/completions`, { prompt: t.json.tokens, max_tokens: 24, temperature: 0,
                                                             ignore_eos: true });
      assert.equal(plain.status, 200, plain.text);
      assert.equal(c.choices[0].message.content, plain.json.choices[0].text);
      // Streamed: the same reply piece by piece, usage in the last chunk.
      const stream = await client.chat.completions.create({ model: 'x', messages, max_tokens: 24, temperature: 0,
                                                            ignore_eos: true, stream: true,
                                                            stream_options: { include_usage: true } });
      let text = '', last = null;
      for await (const ch of stream) { text += ch.choices[0]?.delta?.content ?? ''; last = ch; }
      assert.equal(text, c.choices[0].message.content);
      assert.equal(last.usage?.completion_tokens, 24);
      // Chat logprobs (OpenAI's shape), streamed and not: one entry per generated token, the
      // chosen token the most likely (greedy), top_logprobs of the asked length, the same
      // entries either way; the chosen logprob is the legacy endpoint's for the same ids.
      const lpArgs = { model: 'x', messages, max_tokens: 24, temperature: 0, ignore_eos: true, logprobs: true,
                       top_logprobs: 3 };
      const lc = (await client.chat.completions.create(lpArgs)).choices[0].logprobs.content;
      assert.equal(lc.length, 24);
      for (const e of lc) {
        assert.equal(e.top_logprobs.length, 3);
        assert.equal(e.token, e.top_logprobs[0].token, JSON.stringify(e));
        assert.ok(e.logprob <= 0 && e.logprob === e.top_logprobs[0].logprob, JSON.stringify(e));
        assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
        assert.ok(Array.isArray(e.bytes) && e.bytes.length > 0);
      }
      const ls = [];
      for await (const ch of await client.chat.completions.create({ ...lpArgs, stream: true }))
        ls.push(...(ch.choices[0]?.logprobs?.content ?? []));
      assert.deepEqual(ls, lc);
      const lplain = await post(`${srv.url}/v1/completions`, { prompt: t.json.tokens, max_tokens: 24, temperature: 0,
                                                              ignore_eos: true, logprobs: 0 });
      assert.deepEqual(lplain.json.choices[0].logprobs.token_logprobs, lc.map((e) => e.logprob));
      // A conversation the template rejects is the client's error, not a 500.
      const bad = await post(`${srv.url}/v1/chat/completions`, { messages: [] });
      assert.ok(bad.status === 400 || bad.status === 200, `empty messages: ${bad.status} ${bad.text}`);
    } finally {
      await stopServer(srv);
    }
  },
  // The openai client: completions and chat, streamed and not, models.
  async openai() {
    const require = createRequire(`${NODE_MODULES}/`);
    const OpenAI = require('openai');
    const srv = await startServer(['--api-key', 'sekret']);
    try {
      const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'sekret', maxRetries: 0 });
      const models = await client.models.list();
      assert.equal(models.data[0].id, 'stories260K');
      // Greedy text against llama2.c's own run of this model (an independent reference).
      const ref = llama2cReference();
      const c = await client.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 110,
                                                  temperature: 0, ignore_eos: true });
      assert.equal(c.object, 'text_completion');
      assert.equal(c.choices[0].finish_reason, 'length');
      assert.equal(c.usage.completion_tokens, 110);
      assert.equal(c.usage.prompt_tokens, 5);  // BOS + 4
      assert.ok((PROMPT + c.choices[0].text).startsWith(ref), `greedy text:\n${PROMPT + c.choices[0].text}`);
      // Streamed: the same text, piece by piece, usage in the last chunk.
      const stream = await client.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 110,
                                                       temperature: 0, ignore_eos: true, stream: true });
      let text = '', chunks = 0, last = null;
      for await (const ch of stream) { text += ch.choices[0]?.text ?? ''; chunks++; last = ch; }
      assert.equal(text, c.choices[0].text);
      assert.ok(chunks > 50, `chunks: ${chunks}`);
      assert.equal(last.choices[0].finish_reason, 'length');
      assert.equal(last.usage.completion_tokens, 110);
      // A stop string ends generation before it (and it is not returned).
      const s = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 60, temperature: 0,
                                                  stop: ['Lily'] });
      assert.equal(s.choices[0].text, ', there was a little girl named ');
      assert.equal(s.choices[0].finish_reason, 'stop');
      // OpenAI's logit_bias and frequency_penalty change what greedy picks (an ignored field
      // would leave the text as it was): the greedy text goes on with ",", so banning the ","
      // token (its id from /tokenize) must start it otherwise.
      assert.ok(c.choices[0].text.startsWith(','), c.choices[0].text);
      const tk = await post(`${srv.url}/tokenize`, { content: PROMPT + ',', add_special: false },
                            { Authorization: 'Bearer sekret' });
      const comma = tk.json.tokens.at(-1);
      const nb = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 8, temperature: 0,
                                                   logit_bias: { [comma]: -100 } });
      assert.ok(!nb.choices[0].text.startsWith(','), `banned ",": ${nb.choices[0].text}`);
      const fp = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 110, temperature: 0,
                                                   ignore_eos: true, frequency_penalty: 2 });
      assert.notEqual(fp.choices[0].text, c.choices[0].text, 'frequency_penalty changed nothing');
      // echo: the prompt's text first; with logprobs its tokens' too (the first unscored),
      // each one the logprob its own step gave when it was generated (prefill's batched
      // products against decode's one-row ones: 1e-4).
      const gen = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 8, temperature: 0,
                                                    logprobs: 1 });
      const ids = (await post(`${srv.url}/tokenize`, { content: PROMPT }, { Authorization: 'Bearer sekret' })).json.tokens;
      const genIds = (await post(`${srv.url}/tokenize`, { content: PROMPT + gen.choices[0].text },
                                 { Authorization: 'Bearer sekret' })).json.tokens;
      const echo = await client.completions.create({ model: 'x', prompt: genIds, max_tokens: 0, echo: true, logprobs: 1 });
      const el = echo.choices[0].logprobs;
      assert.equal(echo.choices[0].text, PROMPT + gen.choices[0].text);
      assert.equal(el.tokens.length, genIds.length);
      assert.equal(el.token_logprobs[0], null);
      assert.equal(el.top_logprobs[0], null);
      assert.equal(genIds.length, ids.length + 8, 'the text re-tokenises to the prompt and the 8 generated ids');
      gen.choices[0].logprobs.token_logprobs.forEach((x, k) =>
        assert.ok(Math.abs(el.token_logprobs[ids.length + k] - x) < 1e-4, `token ${k}: ${el.token_logprobs[ids.length + k]} ${x}`));
      const plainEcho = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 4, echo: true,
                                                         temperature: 0 });
      assert.ok(plainEcho.choices[0].text.startsWith(PROMPT + ','), plainEcho.choices[0].text);
      assert.equal(plainEcho.choices[0].logprobs, null);
      // A bounded int4 cache through the extension field, longer than its window.
      const b = await client.completions.create({ model: 'x', prompt: PROMPT, max_tokens: 80, temperature: 0,
                                                  ignore_eos: true, kv_cache: { quantize: 'int4', sink: 4, window: 28 } });
      assert.equal(b.usage.completion_tokens, 80);
      // Chat: this model has no chat template, so the 400 that says so.
      await assert.rejects(client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
                           (e) => e.status === 400 && /no chat template/.test(e.message));
      await assert.rejects(client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }],
                                                            stream: true }),
                           (e) => e.status === 400 && /no chat template/.test(e.message));
      // Wrong key: 401.
      const bad = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
      await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.code === 'invalid_api_key');
      assert.equal((await fetch(`${srv.url}/health`)).status, 200);  // no key needed
    } finally {
      await stopServer(srv);
    }
  },

  // Bad input: each is an OpenAI-shaped error with the right status.
  async errors() {
    const srv = await startServer(['--max-body', '64KiB']);
    try {
      const u = `${srv.url}/v1/completions`;
      const expectError = async (body, status, param, what) => {
        const r = await post(u, body);
        assert.equal(r.status, status, `${what}: ${r.text}`);
        assert.ok(r.json?.error?.message, `${what}: error.message in ${r.text}`);
        for (const k of ['type', 'param', 'code']) assert.ok(k in r.json.error, `${what}: error.${k}`);
        if (param !== undefined) assert.equal(r.json.error.param, param, `${what}: ${r.text}`);
      };
      await expectError('{"prompt": ', 400, null, 'bad JSON');
      await expectError({ prompt: PROMPT, max_tokens: 'ten' }, 400, 'max_tokens', 'wrong type');
      await expectError({ prompt: PROMPT, temperature: [1] }, 400, 'temperature', 'wrong type');
      await expectError({ prompt: PROMPT, kv_cache: { quantize: 'int4', bogus: 1 } }, 400, 'kv_cache.bogus',
                        'unknown kv_cache field');
      await expectError({ prompt: [1, 99999] }, 400, 'prompt[1]', 'token id out of range');
      await expectError({ prompt: 'x'.repeat(100000) }, 413, null, 'oversized body');
      await expectError({ prompt: Array(600).fill(7) }, 400, 'prompt', 'prompt longer than the context');
      const r404 = await fetch(`${srv.url}/v2/nothing`);
      assert.equal(r404.status, 404);
      assert.ok((await r404.json()).error.message.includes('/v2/nothing'));
      // A long prompt is fine with a bounded cache.
      const ok = await post(u, { prompt: Array(600).fill(7), max_tokens: 2, kv_cache: { sink: 4, window: 60 } });
      assert.equal(ok.status, 200, ok.text);
      // tokenize / detokenize round trip.
      const t = await post(`${srv.url}/tokenize`, { content: PROMPT });
      assert.equal(t.json.tokens[0], 1);
      const d = await post(`${srv.url}/detokenize`, { tokens: t.json.tokens });
      assert.equal(d.json.content, PROMPT);
      for (const body of [{ tokens: 'x' }, { tokens: [1, -3] }, {}]) {
        const bd = await post(`${srv.url}/detokenize`, body);
        assert.equal(bd.status, 400, JSON.stringify(body));
        assert.equal(bd.json.error.param, 'tokens');
      }
      const bt = await post(`${srv.url}/tokenize`, { content: 5 });
      assert.equal(bt.status, 400);
      assert.equal(bt.json.error.param, 'content');
      const m = await metrics(srv.url);
      assert.equal(m['ptllm_kv_bytes_budget'], 256 * 1024 * 1024);
    } finally {
      await stopServer(srv);
    }
  },

  // 100 clients that go away mid-stream: every cache is freed.
  async disconnect() {
    const srv = await startServer(['--max-queue', '200']);
    try {
      const one = async (i) => {
        const ac = new AbortController();
        const res = await fetch(`${srv.url}/v1/completions`, {
          method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ prompt: PROMPT, max_tokens: 400, ignore_eos: true, stream: true, seed: i }) });
        assert.equal(res.status, 200);
        const reader = res.body.getReader();
        let got = '';
        while (!got.includes('"text"')) got += new TextDecoder().decode((await reader.read()).value);
        ac.abort();
      };
      await Promise.all(Array.from({ length: 100 }, (_, i) => one(i).catch((e) => {
        if (e.name !== 'AbortError') throw e;
      })));
      let m;
      for (let t = 0; t < 200; t++) {
        m = await metrics(srv.url);
        if (m['ptllm_requests_running'] === 0 && m['ptllm_requests_queued'] === 0) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.equal(m['ptllm_requests_running'], 0);
      assert.equal(m['ptllm_kv_bytes_in_use'], 0);
      assert.equal(m['ptllm_kv_bytes_reserved'], 0);
      assert.equal(m['ptllm_requests_finished_total{reason="cancelled"}'], 100);
      // And the server still serves.
      const r = await post(`${srv.url}/v1/completions`, { prompt: PROMPT, max_tokens: 3 });
      assert.equal(r.status, 200);
    } finally {
      await stopServer(srv);
    }
  },

  // SIGTERM: new requests get 503, the running stream finishes, exit 0. The
  // running request is long (a bounded cache, so it may pass the context) so
  // that it is still streaming while the test sees the server drain, however
  // fast the machine: no fixed sleep decides the outcome.
  async sigterm() {
    const srv = await startServer();
    const N = 5000;
    const res = await fetch(`${srv.url}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: PROMPT, max_tokens: N, ignore_eos: true, stream: true, temperature: 0,
                             kv_cache: { sink: 4, window: 60 } }) });
    const reader = res.body.getReader();
    let body = new TextDecoder().decode((await reader.read()).value);
    srv.kill('SIGTERM');
    for (let i = 0; i < 500 && (await fetch(`${srv.url}/health`)).status !== 503; i++)
      await new Promise((r) => setTimeout(r, 10));
    const late = await post(`${srv.url}/v1/completions`, { prompt: PROMPT, max_tokens: 3 });
    assert.equal(late.status, 503, late.text);
    assert.equal(late.json.error.code, 'draining');
    assert.equal((await fetch(`${srv.url}/health`)).status, 503);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      body += new TextDecoder().decode(value);
    }
    const events = sseEvents(body);
    assert.equal(events.at(-1).choices[0].finish_reason, 'length');
    assert.equal(events.at(-1).usage.completion_tokens, N);
    const { code } = await srv.exited;
    assert.equal(code, 0, srv.log());
  },

  // Batch invariance end to end: 16 concurrent requests, each as it is alone.
  async batch() {
    const srv = await startServer();
    try {
      const req = (i) => ({ prompt: `${PROMPT} ${['Tom', 'a cat', 'Sue', 'the sun'][i % 4]}`, max_tokens: 40,
                            ignore_eos: true, temperature: i % 2 ? 0.9 : 0, top_k: 40, seed: 100 + i });
      const alone = [];
      for (let i = 0; i < 16; i++) alone.push((await post(`${srv.url}/v1/completions`, req(i))).json.choices[0].text);
      const together = await Promise.all(Array.from({ length: 16 }, (_, i) =>
        post(`${srv.url}/v1/completions`, req(i)).then((r) => r.json.choices[0].text)));
      assert.deepEqual(together, alone);
      const m = await metrics(srv.url);
      assert.ok(m['ptllm_batch_size_sum'] / m['ptllm_batch_size_count'] > 1.5, 'steps were batched');
    } finally {
      await stopServer(srv);
    }
  },

  // flagship-27m: transformers' greedy continuations of five prompts (token-id
  // prompts, all five at once, streamed and not), through the openai client.
  async flagship() {
    const require = createRequire(`${NODE_MODULES}/`);
    const OpenAI = require('openai');
    const ref = JSON.parse(readFileSync(`${REPO}/models/flagship-27m/reference.json`, 'utf8')).prompts;
    const srv = await startServer([], `${REPO}/models/flagship-27m.tinygpt`);
    try {
      const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0 });
      // With logprobs: 2, each step's two most likely tokens, whose difference is the
      // reference's top-1/top-2 logit margin (log-softmax shifts both alike).
      const tops = [];
      const run = async (p, i) => {
        const args = { model: 'flagship', prompt: p.prompt_ids, max_tokens: 64, temperature: 0, ignore_eos: true,
                       logprobs: 2 };
        if (i % 2 === 0) {
          const c = (await client.completions.create(args)).choices[0];
          tops[i] = { top: c.logprobs.top_logprobs, chosen: c.logprobs.token_logprobs };
          return c.text;
        }
        let text = '';
        tops[i] = { top: [], chosen: [] };
        for await (const ch of await client.completions.create({ ...args, stream: true })) {
          text += ch.choices[0]?.text ?? '';
          tops[i].top.push(...(ch.choices[0]?.logprobs?.top_logprobs ?? []));
          tops[i].chosen.push(...(ch.choices[0]?.logprobs?.token_logprobs ?? []));
        }
        return text;
      };
      const texts = await Promise.all(ref.map(run));
      // Every top-1/top-2 margin in the reference is > 3e-3, far above bf16-weight fp32 arithmetic noise.
      texts.forEach((t, i) => assert.equal(t, ref[i].greedy_text, `prompt ${JSON.stringify(ref[i].prompt)}`));
      // Margins against transformers' within 0.03 logits: this engine's fp32 arithmetic over
      // bf16 weights measured a median difference of 4e-4 and a largest of 0.021 over these
      // 320 steps (2026-12-05, this VM). Greedy: the chosen token is the most likely one.
      tops.forEach(({ top, chosen }, i) => {
        const margins = ref[i].top1_top2_margin;
        assert.equal(top.length, 64, `prompt ${i}: logprobs of every token, streamed or not`);
        assert.equal(chosen.length, 64);
        top.forEach((t, s) => {
          const v = Object.values(t).sort((a, b) => b - a);
          assert.equal(v.length, 2, `prompt ${i} step ${s}: ${JSON.stringify(t)}`);
          assert.ok(v[0] <= 0 && Math.abs(chosen[s] - v[0]) < 1e-12, `prompt ${i} step ${s}: ${chosen[s]} ${v}`);
          assert.ok(Math.abs(v[0] - v[1] - margins[s]) < 0.03,
                    `prompt ${i} step ${s}: margin ${v[0] - v[1]} against transformers' ${margins[s]}`);
        });
      });
      // The same margins scored as a prompt (echo, max_tokens 0: the prompt's own logprobs, as
      // evaluation harnesses ask for them): the prompt and its greedy continuation fed at once,
      // token P + k's entry scored by the logits after token P + k - 1.
      for (const [i, p] of ref.entries()) {
        const ids = [...p.prompt_ids, ...p.greedy_new_tokens];
        const r = await post(`${srv.url}/v1/completions`, { prompt: ids, max_tokens: 0, echo: true, logprobs: 2 });
        assert.equal(r.status, 200, r.text);
        const lp = r.json.choices[0].logprobs;
        assert.equal(lp.tokens.length, ids.length);
        assert.equal(lp.token_logprobs[0], null);
        assert.equal(r.json.usage.completion_tokens, 0);
        p.greedy_new_tokens.forEach((_, k) => {
          const v = Object.values(lp.top_logprobs[p.prompt_ids.length + k]).sort((a, b) => b - a);
          assert.ok(Math.abs(v[0] - v[1] - p.top1_top2_margin[k]) < 0.03,
                    `echo, prompt ${i} token ${k}: margin ${v[0] - v[1]} against ${p.top1_top2_margin[k]}`);
        });
      }
    } finally {
      await stopServer(srv);
    }
  },

  // 1,000 simultaneous connections: every one answered (200 or a quick 429), no crash.
  async connections() {
    const srv = await startServer(['--max-queue', '32']);
    try {
      const t0 = Date.now();
      const statuses = await Promise.all(Array.from({ length: 1000 }, () =>
        post(`${srv.url}/v1/completions`, { prompt: PROMPT, max_tokens: 8 }).then((r) => r.status)));
      const n200 = statuses.filter((s) => s === 200).length, n429 = statuses.filter((s) => s === 429).length;
      assert.equal(n200 + n429, 1000, `statuses: ${[...new Set(statuses)]}`);
      assert.ok(n200 >= 48 && n429 > 0, `200: ${n200}, 429: ${n429}`);
      const m = await metrics(srv.url);
      assert.equal(m['ptllm_requests_rejected_total{reason="queue_full"}'], n429);
      console.log(`1000 connections: ${n200} served, ${n429} refused with 429, in ${Date.now() - t0} ms`);
    } finally {
      await stopServer(srv);
    }
  },
};

const name = process.argv[2];
if (!groups[name]) {
  console.error(`usage: node e2e.mjs ${Object.keys(groups).join('|')}`);
  process.exit(2);
}
try {
  await groups[name]();
  console.log(`serve e2e ${name}: passed`);
} catch (e) {
  console.error(`serve e2e ${name}: FAILED\n`, e);
  process.exit(1);
}
