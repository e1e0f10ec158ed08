// Load generator for `posttrainllm serve`: C concurrent streamed completions,
// each timed client-side. Prints time to first token and inter-token latency
// (p50 / p99) and the aggregate generated tokens/s, as one JSON line, with the
// server's own means over the run (from /metrics: submission to first token,
// token to token, sequences per decode step), which leave out client overhead.
// Usage: node scripts/serve_load.mjs URL [--concurrency 16] [--requests 32] [--max-tokens 64]
//        [--prompt-tokens 0 (0 = a short text prompt; N = N token ids)] [--kv-cache JSON]
//        [--seconds S (0 = off; else no new request is started after S seconds: a soak)]
//        [--warmup T (0 = off; else one untimed streamed request of T tokens first, so that this
//         process's own start-up -- module loading, the JIT compiling the fetch and SSE path --
//         is over before the timed requests: on the server's two cores it otherwise slows the
//         first timed stream's steps; docs/SERVER.md, "Session 25")]
import { forEachEvent, scrapeMetrics } from './lib/serve_client.mjs';
const [url, ...rest] = process.argv.slice(2);
if (!url) { console.error('usage: node serve_load.mjs URL [--concurrency C] [--requests N] [--max-tokens T]'); process.exit(2); }
const opt = { concurrency: 16, requests: 32, 'max-tokens': 64, 'prompt-tokens': 0, 'kv-cache': '', seconds: 0, warmup: 0 };
for (let i = 0; i < rest.length; i += 2) {
  const k = rest[i].replace(/^--/, '');
  if (!(k in opt)) { console.error(`unknown flag ${rest[i]}`); process.exit(2); }
  opt[k] = k === 'kv-cache' ? rest[i + 1] : Number(rest[i + 1]);
}
const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN; };
const ttft = [], itl = [];
// PTLLM_LOAD_TRACE=FILE: every event's arrival (request, monotonic us), to set beside the server's PTLLM_SERVE_TRACE.
const arrivals = process.env.PTLLM_LOAD_TRACE ? [] : null;
let tokens = 0, failed = 0, next = 0;
// Request i, timed into ttft/itl/tokens unless `warm` (the untimed warm-up request).
async function one(i, warm = false) {
  const body = { prompt: opt['prompt-tokens'] > 0 ? Array.from({ length: opt['prompt-tokens'] }, (_, k) => 1 + ((k * 7 + i) % 400))
                                               : 'Once upon a time',
                 max_tokens: warm ? opt.warmup : opt['max-tokens'], ignore_eos: true, stream: true, seed: i, temperature: 0.8 };
  if (opt['kv-cache']) body.kv_cache = JSON.parse(opt['kv-cache']);
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                                    body: JSON.stringify(body) });
  if (res.status !== 200) { failed++; console.error(`request ${i}: HTTP ${res.status}: ${await res.text()}`); return; }
  let last = null, finished = false;
  await forEachEvent(res.body, (j) => {
    if (j.error) { failed++; console.error(`request ${i}: ${JSON.stringify(j.error)}`); return; }
    if (warm) { finished ||= Boolean(j.usage); return; }
    if (j.usage) { tokens += j.usage.completion_tokens; finished = true; return; }
    const now = performance.now();
    if (arrivals) arrivals.push(`${i} ${process.hrtime.bigint() / 1000n}`);
    if (last === null) ttft.push(now - t0); else itl.push(now - last);
    last = now;
  });
  if (!finished) { failed++; console.error(`request ${i}: the stream ended without its final chunk`); }
}
const scrape = () => scrapeMetrics(url);
const mean = (a, b, name) => (b[`${name}_sum`] - a[`${name}_sum`]) / (b[`${name}_count`] - a[`${name}_count`]);
if (opt.warmup > 0) {
  await one(999999, true);
  if (failed) { console.error('serve_load: the warm-up request failed'); process.exit(1); }
}
const before = await scrape();
const t0 = performance.now();
const timedFromUs = Number(process.hrtime.bigint() / 1000n);  // CLOCK_MONOTONIC, as PTLLM_SERVE_TRACE's steps
await Promise.all(Array.from({ length: opt.concurrency }, async () => {
  while (next < opt.requests && !(opt.seconds > 0 && performance.now() - t0 > 1000 * opt.seconds)) await one(next++);
}));
const secs = (performance.now() - t0) / 1000;
const after = await scrape();
console.log(JSON.stringify({ ...opt, seconds: +secs.toFixed(2), requests_done: next, failed, generated_tokens: tokens,
  tokens_per_second: +(tokens / secs).toFixed(1), ttft_ms_p50: +pct(ttft, 0.5).toFixed(1), ttft_ms_p99: +pct(ttft, 0.99).toFixed(1),
  itl_ms_p50: +pct(itl, 0.5).toFixed(2), itl_ms_p99: +pct(itl, 0.99).toFixed(2),
  server_ttft_ms_mean: +(1000 * mean(before, after, 'ptllm_time_to_first_token_seconds')).toFixed(1),
  server_itl_ms_mean: +(1000 * mean(before, after, 'ptllm_inter_token_latency_seconds')).toFixed(2),
  server_batch_mean: +mean(before, after, 'ptllm_batch_size').toFixed(2), timed_from_us: timedFromUs }));
if (arrivals) (await import('node:fs')).writeFileSync(process.env.PTLLM_LOAD_TRACE, arrivals.join('\n') + '\n');
