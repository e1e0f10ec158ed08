#!/usr/bin/env node
// llama.cpp (node-llama-cpp, prebuilt, CPU) scoring a text by llama-perplexity's
// protocol, for a side-by-side check of `perplexity --llama-cpp` on this machine:
// the text tokenized once with BOS first, consecutive N_CTX-token chunks, each
// chunk's first token replaced by BOS, the predictions of the second half
// (tokens N_CTX/2+1 .. N_CTX-1) scored from llama.cpp's full next-token
// distribution (temperature 1, no top-k/top-p/min-p).
//
//   node scripts/llamacpp_perplexity.mjs FILE.gguf TEXT [--ctx 512] [--chunks 8] [--threads 2]
//
// Prints one JSON line {ppl, predictions, chunks}. node-llama-cpp as in llamacpp_greedy.mjs.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

function usage(msg) {
  if (msg) console.error(`llamacpp_perplexity: ${msg}`);
  console.error("usage: llamacpp_perplexity.mjs FILE.gguf TEXT [--ctx 512] [--chunks 8] [--threads 2]");
  process.exit(2);
}
const args = process.argv.slice(2);
let file = null, text = null, nCtx = 512, chunks = 8, threads = 2;
for (let i = 0; i < args.length; ++i) {
  const a = args[i];
  const val = () => (i + 1 < args.length ? Number(args[++i]) : usage(`${a} needs a value`));
  if (a === "--ctx") nCtx = val();
  else if (a === "--chunks") chunks = val();
  else if (a === "--threads") threads = val();
  else if (a.startsWith("--")) usage(`unknown flag ${a}`);
  else if (file === null) file = a;
  else if (text === null) text = a;
  else usage(`unexpected argument ${a}`);
}
if (!file || !text) usage("FILE and TEXT are required");
for (const [n, v] of [["--ctx", nCtx], ["--chunks", chunks], ["--threads", threads]])
  if (!Number.isInteger(v) || v < 1) usage(`${n}: expected a positive integer`);
const here = path.dirname(fileURLToPath(import.meta.url));
const candidates = [process.env.PTLLM_ANCHORS, path.join(here, "..", "tools", "anchors", "node_modules"),
                    "/work/main/tools/anchors/node_modules"].filter(Boolean);
const root = candidates.find((d) => fs.existsSync(path.join(d, "node-llama-cpp", "dist", "index.js")));
if (!root) usage(`node-llama-cpp not found in ${candidates.join(", ")} (npm ci in tools/anchors)`);
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(path.join(root, "node-llama-cpp", "dist", "index.js")).href);

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: file });
const body = model.tokenize(fs.readFileSync(text, "utf8"), false);
const bos = model.tokens.bos;
const tokens = [bos, ...body];
const n = Math.min(chunks, Math.floor(tokens.length / nCtx));
const first = Math.floor(nCtx / 2);
let nll = 0, count = 0;
const gen = { generateNext: { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } } };
for (let c = 0; c < n; ++c) {
  const context = await model.createContext({ contextSize: nCtx, threads, batchSize: nCtx, sequences: 1 });
  const seq = context.getSequence();
  const chunk = tokens.slice(c * nCtx, (c + 1) * nCtx);
  chunk[0] = bos;
  // Logits of chunk tokens first .. nCtx-2 predict tokens first+1 .. nCtx-1.
  const input = chunk.slice(0, nCtx - 1).map((t, i) => (i >= first ? [t, gen] : t));
  const out = await seq.controlledEvaluate(input);
  for (let i = first; i < nCtx - 1; ++i) {
    const p = out[i]?.next?.probabilities?.get(chunk[i + 1]);
    if (!(p > 0)) throw new Error(`chunk ${c} position ${i + 1}: no probability for token ${chunk[i + 1]}`);
    nll -= Math.log(p);
    ++count;
  }
  await context.dispose();
}
console.log(JSON.stringify({ file, ppl: Math.exp(nll / count), predictions: count, chunks: n, ctx: nCtx }));
await model.dispose();
