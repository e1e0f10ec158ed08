#!/usr/bin/env node
// llama.cpp as the independent anchor: loads a GGUF through node-llama-cpp
// (prebuilt llama.cpp, pinned in tools/anchors) and prints its greedy
// continuation of the given token ids, comma-separated, on stdout.
//
//   node scripts/llamacpp_greedy.mjs FILE.gguf --ids 1,2,3 [--tokens 32] [--threads 1]
//
// node-llama-cpp is found as scripts/lib/node_llama.mjs says.
// Generation stops after --tokens ids; an end-of-generation token is printed
// and ends it early. Exit 2 on bad arguments, 1 if llama.cpp cannot load FILE.
import fs from "node:fs";
import path from "node:path";
import { importNodeLlamaCpp } from "./lib/node_llama.mjs";

function usage(msg) {
  if (msg) console.error(`llamacpp_greedy: ${msg}`);
  console.error("usage: llamacpp_greedy.mjs FILE.gguf --ids 1,2,3 [--tokens 32] [--threads 1]");
  process.exit(2);
}

const args = process.argv.slice(2);
let file = null, ids = null, tokens = 32, threads = 1;
for (let i = 0; i < args.length; ++i) {
  const a = args[i];
  const val = () => (i + 1 < args.length ? args[++i] : usage(`${a} needs a value`));
  if (a === "--ids") ids = val();
  else if (a === "--tokens") tokens = Number(val());
  else if (a === "--threads") threads = Number(val());
  else if (a.startsWith("--")) usage(`unknown flag ${a}`);
  else if (file === null) file = a;
  else usage(`unexpected argument ${a}`);
}
if (!file || ids === null) usage("FILE and --ids are required");
if (!fs.existsSync(file)) usage(`${file}: no such file`);
const prompt = ids.split(",").map((s) => Number(s.trim()));
if (prompt.length === 0 || prompt.some((x) => !Number.isInteger(x) || x < 0)) usage(`--ids ${ids}: expected comma-separated token ids`);
if (!Number.isInteger(tokens) || tokens < 1) usage(`--tokens: expected a positive integer`);
if (!Number.isInteger(threads) || threads < 1) usage(`--threads: expected a positive integer`);

const { getLlama, LlamaLogLevel } = await importNodeLlamaCpp(usage);

try {
  const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file });
  for (const id of prompt)
    if (id >= model.tokens.size ?? Infinity) usage(`--ids: ${id} is outside the vocabulary`);
  const context = await model.createContext({ contextSize: prompt.length + tokens + 1, threads, batchSize: prompt.length + 1 });
  const seq = context.getSequence();
  const out = [];
  for await (const t of seq.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
    out.push(t);
    if (out.length >= tokens || model.isEogToken(t)) break;
  }
  console.log(out.join(","));
  await context.dispose();
  await model.dispose();
} catch (e) {
  console.error(`llamacpp_greedy: ${file}: ${e.message ?? e}`);
  process.exit(1);
}
