// Finds and imports node-llama-cpp (prebuilt llama.cpp, pinned in tools/anchors):
// $PTLLM_ANCHORS (a node_modules folder), else tools/anchors/node_modules of this
// checkout, else /work/main/tools/anchors. `fail(msg)` is called when it is missing.
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export async function importNodeLlamaCpp(fail) {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const candidates = [process.env.PTLLM_ANCHORS, path.join(here, "..", "..", "tools", "anchors", "node_modules"),
                      "/work/main/tools/anchors/node_modules"].filter(Boolean);
  const root = candidates.find((d) => fs.existsSync(path.join(d, "node-llama-cpp", "dist", "index.js")));
  if (!root) fail(`node-llama-cpp not found in ${candidates.join(", ")} (npm ci in tools/anchors)`);
  return import(pathToFileURL(path.join(root, "node-llama-cpp", "dist", "index.js")).href);
}
