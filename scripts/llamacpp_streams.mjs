#!/usr/bin/env node
// llama.cpp (node-llama-cpp, pinned in tools/anchors) as the live anchor for
// `serve`: K sequences of one context generate T tokens each, concurrently
// (node-llama-cpp batches the sequences of a context into one llama_decode),
// from the same short prompt and sampling as scripts/serve_load.mjs. Prints one
// JSON line: aggregate generated tokens/s, time to first token and
// inter-token latency p50/p99 (client side, per sequence), and the KV cache
// bytes the context holds (type --kv-type: f16 default, q8_0, q4_0).
//
//   node scripts/llamacpp_streams.mjs FILE.gguf [--streams 16] [--tokens 200] [--threads 2]
//        [--ctx-per-seq 512] [--kv-type f16|q8_0|q4_0]
import fs from "node:fs";
import path from "node:path";
import { importNodeLlamaCpp } from "./lib/node_llama.mjs";

function usage(msg) {
  if (msg) console.error(`llamacpp_streams: ${msg}`);
  console.error("usage: llamacpp_streams.mjs FILE.gguf [--streams K] [--tokens T] [--threads N] [--ctx-per-seq C] [--kv-type f16|q8_0|q4_0]");
  process.exit(2);
}
const args = process.argv.slice(2);
const opt = { streams: 16, tokens: 200, threads: 2, "ctx-per-seq": 512, "kv-type": "f16" };
let file = null;
for (let i = 0; i < args.length; ++i) {
  const a = args[i];
  if (a.startsWith("--")) {
    const k = a.slice(2);
    if (!(k in opt)) usage(`unknown flag ${a}`);
    if (i + 1 >= args.length) usage(`${a} needs a value`);
    opt[k] = k === "kv-type" ? args[++i] : Number(args[++i]);
    if (k !== "kv-type" && (!Number.isInteger(opt[k]) || opt[k] < 1)) usage(`${a}: expected a positive integer`);
  } else if (file === null) file = a;
  else usage(`unexpected argument ${a}`);
}
if (!file) usage("FILE is required");
if (!fs.existsSync(file)) usage(`${file}: no such file`);
if (!["f16", "q8_0", "q4_0"].includes(opt["kv-type"])) usage(`--kv-type ${opt["kv-type"]}: expected f16, q8_0 or q4_0`);

const { getLlama, LlamaLogLevel } = await importNodeLlamaCpp(usage);

const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN; };
try {
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file });
  const K = opt.streams;
  const kv = { f16: "F16", q8_0: "Q8_0", q4_0: "Q4_0" }[opt["kv-type"]];
  const context = await model.createContext({
    contextSize: K * opt["ctx-per-seq"], sequences: K, threads: opt.threads, batchSize: 512,
    // A quantised V cache needs flash attention in llama.cpp.
    ...(kv !== "F16" ? { experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv, flashAttention: true } : {}),
  });
  const prompt = model.tokenize("Once upon a time", true);
  {  // warm-up outside the timing (first decode allocates and faults the weights in), as serve gets
    const w = context.getSequence();
    await w.evaluateWithoutGeneratingNewTokens(prompt);
    w.dispose();
  }
  const ttft = [], itl = [];
  let generated = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: K }, async (_, i) => {
    const seq = context.getSequence();
    let last = null, n = 0;
    for await (const t of seq.evaluate(prompt, { temperature: 0.8, seed: i, yieldEogToken: true })) {
      const now = performance.now();
      if (last === null) ttft.push(now - t0); else itl.push(now - last);
      last = now;
      if (++n >= opt.tokens) break;
    }
    generated += n;
  }));
  const secs = (performance.now() - t0) / 1000;
  console.log(JSON.stringify({ engine: "llama.cpp (node-llama-cpp 3.21.1)", file: path.basename(file), streams: K,
    tokens: opt.tokens, threads: opt.threads, kv_type: opt["kv-type"], seconds: +secs.toFixed(2), generated_tokens: generated,
    tokens_per_second: +(generated / secs).toFixed(1), ttft_ms_p50: +pct(ttft, 0.5).toFixed(1), ttft_ms_p99: +pct(ttft, 0.99).toFixed(1),
    itl_ms_p50: +pct(itl, 0.5).toFixed(2), itl_ms_p99: +pct(itl, 0.99).toFixed(2) }));
  await context.dispose();
  await model.dispose();
} catch (e) {
  console.error(`llamacpp_streams: ${file}: ${e.message ?? e}`);
  process.exit(1);
}
