// Users at a fixed KV budget: for each cache mode, start `posttrainllm serve
// --kv-budget B` with that mode as the server default, send (capacity + extra)
// users who each stream T tokens, and report how many ran at once, that all
// finished and none was refused, and the server's RSS over the run.
// Capacity is the server's own admission arithmetic (the budget over the bytes
// one request reserves, printed at start); the peak of ptllm_requests_running
// shows it is reached. An unbounded cache stops at the model's context
// (finish_reason "length" with fewer tokens), as it must.
// Usage: node scripts/serve_budget.mjs [--bin build/app/posttrainllm] [--model M]
//        [--budget 64MiB] [--tokens 2000] [--extra 4] [--threads 2] [--http-threads 72] [--modes all|name,name]
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { forEachEvent, scrapeMetrics } from './lib/serve_client.mjs';

const opt = { bin: 'build/app/posttrainllm', model: '', budget: '64MiB', tokens: 2000, extra: 4,
              threads: 2, modes: 'all', 'http-threads': 72 };
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i += 2) {
  const k = args[i].replace(/^--/, '');
  if (!(k in opt) || args[i + 1] === undefined) { console.error(`serve_budget: unknown or valueless flag ${args[i]}`); process.exit(2); }
  opt[k] = typeof opt[k] === 'number' ? Number(args[i + 1]) : args[i + 1];
}
const win = ['--streaming-llm-sink', '4', '--streaming-llm-window', '252'];
const MODES = {
  'fp32 unbounded': [],
  'fp32 sink4+window252': [...win],
  'int8 sink4+window252': [...win, '--kv-quantize', 'int8'],
  'int4 sink4+window252': [...win, '--kv-quantize', 'int4'],
  'int2 sink4+window252': [...win, '--kv-quantize', 'int2'],
  'int4 sink4+window252 residual32': [...win, '--kv-quantize', 'int4', '--kivi-residual', '32'],
  'int2 sink4+window252 residual32': [...win, '--kv-quantize', 'int2', '--kivi-residual', '32'],
};
const names = opt.modes === 'all' ? Object.keys(MODES) : opt.modes.split(',');
for (const n of names) if (!(n in MODES)) { console.error(`serve_budget: unknown mode "${n}"`); process.exit(2); }

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const rssMiB = (pid) => {
  try { return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) / 1024; }
  catch { return NaN; }  // no /proc (macOS): RSS is not reported
};

const scrape = scrapeMetrics;
const sumPrefix = (m, prefix) => Object.entries(m).filter(([k]) => k.startsWith(prefix)).reduce((s, [, v]) => s + v, 0);

// --http-threads: with --max-sequences/--max-queue 4096 the default pool is 8,208 threads, and
// the /metrics polls (4 a second) land on a different idle thread each time (the pool's condition
// variable wakes the longest waiter), each touched for the first time: ~40 KiB of RSS a poll,
// which is the pool warming up, not the server growing. A pool just above the users (--http-threads,
// default 72) warms up in the first seconds.
function startServer(flags) {
  const argv = ['serve', ...(opt.model ? [opt.model] : []), '--port', '0', '--kv-budget', opt.budget,
                '--threads', String(opt.threads), '--max-sequences', '4096', '--max-queue', '4096',
                '--http-threads', String(opt['http-threads']), ...flags];
  const p = spawn(opt.bin, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    let err = '';
    p.stderr.on('data', (d) => {
      err += d;
      const m = /listening on (http:\/\/[\d.]+:\d+).*kv budget (\d+) bytes \((\d+) per default request\)/.exec(err);
      if (m) resolve({ p, url: m[1], budget: Number(m[2]), need: Number(m[3]) });
    });
    p.on('exit', (code) => reject(new Error(`server exited (${code}) before listening: ${err.trim()}`)));
  });
}

async function user(url, i) {
  const res = await fetch(`${url}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: opt.tokens, ignore_eos: true, stream: true,
                           seed: i, temperature: 0.8 }) });
  if (res.status !== 200) return { status: res.status, tokens: 0, finish: null };
  let tokens = 0, finish = null;
  await forEachEvent(res.body, (j) => {
    if (j.choices?.[0]?.finish_reason) finish = j.choices[0].finish_reason;
    if (j.usage) tokens = j.usage.completion_tokens;
  });
  return { status: 200, tokens, finish };
}

const rows = [];
for (const name of names) {
  const srv = await startServer(MODES[name]);
  const capacity = Math.floor(srv.budget / srv.need);
  const users = capacity + opt.extra;
  if (users + 2 > opt['http-threads']) { srv.p.kill('SIGTERM'); console.error(`serve_budget: ${users} users need --http-threads ${users + 2} or more`); process.exit(2); }
  let peak = 0, peakBytes = 0, done = false;
  const rss = [];
  const poll = (async () => {
    while (!done) {
      const m = await scrape(srv.url);
      peak = Math.max(peak, m.ptllm_requests_running);
      peakBytes = Math.max(peakBytes, m.ptllm_kv_bytes_in_use);
      rss.push(rssMiB(srv.p.pid));
      await sleep(250);
    }
  })();
  const t0 = performance.now();
  const results = await Promise.all(Array.from({ length: users }, (_, i) => user(srv.url, i)));
  const secs = (performance.now() - t0) / 1000;
  done = true; await poll;
  const m = await scrape(srv.url);
  srv.p.kill('SIGTERM');
  await new Promise((r) => srv.p.on('exit', r));
  const toks = results.map((r) => r.tokens);
  const gen = toks.reduce((a, b) => a + b, 0);
  // RSS after the first quarter of the run (all admitted caches allocated) vs its maximum.
  const settled = rss.slice(Math.floor(rss.length / 4)).filter((x) => !Number.isNaN(x));
  const row = {
    mode: name, budget_bytes: srv.budget, bytes_per_user: srv.need, capacity, users,
    peak_running: peak, peak_kv_bytes_in_use: peakBytes,
    finished: results.filter((r) => r.status === 200 && r.finish).length,
    refused: results.filter((r) => r.status !== 200).length + sumPrefix(m, 'ptllm_requests_rejected_total'),
    tokens_min: Math.min(...toks), tokens_max: Math.max(...toks),
    seconds: +secs.toFixed(1), tokens_per_second: +(gen / secs).toFixed(1),
    rss_mib_settled_min: +Math.min(...settled).toFixed(1), rss_mib_max: +Math.max(...settled).toFixed(1),
  };
  rows.push(row);
  console.log(JSON.stringify(row));
}
console.log('\n| mode | bytes per user | users at once (capacity / peak running) | finished / users | refused | tokens per user | RSS MiB (settled min → max) | tokens/s |');
console.log('| --- | --- | --- | --- | --- | --- | --- | --- |');
for (const r of rows)
  console.log(`| ${r.mode} | ${(r.bytes_per_user / 1048576).toFixed(2)} MiB | ${r.capacity} / ${r.peak_running} | ${r.finished} / ${r.users} | ${r.refused} | ${r.tokens_min === r.tokens_max ? r.tokens_min : `${r.tokens_min}–${r.tokens_max}`} | ${r.rss_mib_settled_min} → ${r.rss_mib_max} | ${r.tokens_per_second} |`);
const bad = rows.filter((r) => r.finished !== r.users || r.refused > 0 || r.peak_running !== r.capacity);
if (bad.length) { console.error(`serve_budget: ${bad.map((r) => r.mode).join(', ')}: not every user finished, some refused, or capacity not reached`); process.exit(1); }
