#!/usr/bin/env node
// llama.cpp (node-llama-cpp, pinned in tools/anchors) timed the way
// `posttrainllm bench` times us, so the two can be run side by side on one
// GGUF file (scripts/bench_vs_llamacpp.sh alternates them):
//   prefill = one evaluation of P tokens on an empty sequence, logits for the
//             last one (llama-bench's pp: llama_batch_get_one, whose batch
//             outputs its last token);
//   decode  = from an empty sequence, N calls of one token each, each with its
//             logits (llama-bench's tg: one llama_decode per token, the output
//             layer included), the next token picked greedily as ours is not.
// --logits 0 times them as sessions 5-14 did, with evaluateWithoutGeneratingNewTokens():
// that marks no token as an output, so llama.cpp skips the final norm and the
// output projection altogether (the LM head: 21% of the 1B shape's bytes, 31% of
// flagship-27m's), which `posttrainllm bench` always runs (docs/BENCHMARKS.md, Session 15).
// One untimed warm-up of each first (faults the weights in, sizes buffers),
// then --repeat timed runs. Prints one JSON line with every run's tokens/s.
//
//   node scripts/llamacpp_bench.mjs FILE.gguf [-p 512] [-n 128] [-r 5] [--threads 2] [--mmap 1] [--logits 1]
// --mmap 0 loads the file into memory (llama.cpp's --no-mmap) instead of mapping it.
import fs from "node:fs";
import path from "node:path";
import { importNodeLlamaCpp } from "./lib/node_llama.mjs";

function usage(msg) {
  if (msg) console.error(`llamacpp_bench: ${msg}`);
  console.error("usage: llamacpp_bench.mjs FILE.gguf [-p P] [-n N] [-r R] [--threads T] [--mmap 0|1] [--logits 0|1]");
  process.exit(2);
}
const names = { "-p": "p", "-n": "n", "-r": "r", "--threads": "threads", "--mmap": "mmap", "--logits": "logits" };
const opt = { p: 512, n: 128, r: 5, threads: 2, mmap: 1, logits: 1 };
let file = null;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; ++i) {
  const a = args[i];
  if (a.startsWith("-")) {
    if (!(a in names)) usage(`unknown flag ${a}`);
    if (i + 1 >= args.length) usage(`${a} needs a value`);
    const v = Number(args[++i]);
    if ((a === "--mmap" || a === "--logits") && v !== 0 && v !== 1) usage(`${a} ${args[i]}: expected 0 or 1`);
    if (!Number.isInteger(v) || v < 0 || (a !== "-p" && a !== "-n" && a !== "--mmap" && a !== "--logits" && v < 1)) usage(`${a} ${args[i]}: expected a ${a === "-p" || a === "-n" ? "non-negative" : "positive"} integer`);
    opt[names[a]] = v;
  } else if (file === null) file = a;
  else usage(`unexpected argument ${a}`);
}
if (!file) usage("FILE is required");
if (!fs.existsSync(file)) usage(`${file}: no such file`);
if (opt.p === 0 && opt.n === 0) usage("-p and -n are both 0: nothing to time");

const { getLlama, LlamaLogLevel } = await importNodeLlamaCpp(usage);
const mean = (a) => a.reduce((s, x) => s + x, 0) / a.length;
const sd = (a) => { const m = mean(a); return a.length > 1 ? Math.sqrt(a.reduce((s, x) => s + (x - m) ** 2, 0) / (a.length - 1)) : 0; };

try {
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file, useMmap: opt.mmap === 1 });
  const ctxSize = Math.max(256, opt.p, opt.n) + 16;
  const context = await model.createContext({ contextSize: ctxSize, sequences: 1, threads: opt.threads, batchSize: 512 });
  // Ordinary (non-special) ids spread over the vocabulary; speed does not depend on which.
  const vocab = model.tokens?.vocabSize ?? model.fileInsights?.vocabSize ?? 256;
  const ids = (k) => Array.from({ length: k }, (_, i) => 3 + ((i * 7919 + 13) % Math.max(1, Math.min(vocab, 32000) - 3)));
  const prompt = ids(opt.p), gen = ids(opt.n);
  const seq = context.getSequence();
  // A token marked this way is an output: its logits are computed (and a next token picked).
  const withLogits = { generateNext: { token: true, options: { temperature: 0 } } };

  const timePrefill = async () => {
    await seq.clearHistory();
    const t0 = performance.now();
    if (opt.logits) await seq.controlledEvaluate([...prompt.slice(0, -1), [prompt[prompt.length - 1], withLogits]]);
    else await seq.evaluateWithoutGeneratingNewTokens(prompt);
    return opt.p / ((performance.now() - t0) / 1000);
  };
  const timeDecode = async () => {
    await seq.clearHistory();
    const t0 = performance.now();
    if (opt.logits) for (const id of gen) await seq.controlledEvaluate([[id, withLogits]]);
    else for (const id of gen) await seq.evaluateWithoutGeneratingNewTokens([id]);
    return opt.n / ((performance.now() - t0) / 1000);
  };
  const out = { engine: "llama.cpp (node-llama-cpp 3.21.1)", file: path.basename(file), threads: opt.threads, mmap: opt.mmap, logits: opt.logits, repeat: opt.r };
  if (opt.p > 0) {
    await timePrefill();
    const tps = [];
    for (let i = 0; i < opt.r; ++i) tps.push(await timePrefill());
    out.prefill = { tokens: opt.p, tps_mean: +mean(tps).toFixed(2), tps_sd: +sd(tps).toFixed(2), tps: tps.map((x) => +x.toFixed(2)) };
  }
  if (opt.n > 0) {
    await timeDecode();
    const tps = [];
    for (let i = 0; i < opt.r; ++i) tps.push(await timeDecode());
    out.decode = { tokens: opt.n, tps_mean: +mean(tps).toFixed(2), tps_sd: +sd(tps).toFixed(2), tps: tps.map((x) => +x.toFixed(2)) };
  }
  console.log(JSON.stringify(out));
  await context.dispose();
  await model.dispose();
} catch (e) {
  console.error(`llamacpp_bench: ${file}: ${e.message ?? e}`);
  process.exit(1);
}
