// Side-by-side check of GGUF-embedded tokenizers: llama.cpp itself (through
// node-llama-cpp, installed by `npm ci` in this folder) against
// `posttrainllm tokenize FILE --json` on varied texts. Exits 1 on any mismatch.
//
//   node tools/anchors/vocab_anchor.mjs build/app/posttrainllm FILE.gguf...
//
// Two modes per text: no BOS, no special parsing (llama.cpp tokenize(text,
// false) vs `--no-special`), and special parsing with the file's BOS rule
// (tokenize(text, true) with BOS prepended when the vocabulary asks for it vs
// the default).
import { spawnSync } from "node:child_process";
import { getLlama } from "node-llama-cpp";

const [cli, ...files] = process.argv.slice(2);
if (!cli || files.length === 0) {
  console.error("usage: vocab_anchor.mjs POSTTRAINLLM FILE.gguf...");
  process.exit(2);
}

const texts = [
  "Hello world", " Hello world", "Hello World!", "  leading spaces", "trailing spaces   ", "a  b   c    d",
  "\t tab and\nnewline\n\n\nruns\r\n", "\n", " ", "   ", "", "digits 1 12 123 1234 12345 3.14159 1,000,000",
  "unicode: naïve café résumé Ünïcödé ß Ω ∑ ≈ ∞", "emoji: 🦙 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "CJK: 你好，世界！ 日本語のテキスト 한국어 텍스트",
  "mixed: Привет мир, مرحبا, שלום, γειά σου", "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }",
  "def f(x):\n    return x ** 2  # square\n", "punctuation!!! ??? ... --- ___ *** ((( ))) [[]] {{}} <<>> ~~ ``",
  "contractions: I'm, you're, he's, they'll, we'd, it's, don't, ISN'T", "URL https://example.com/a?b=c&d=e#f",
  "email someone@example.org, path /usr/local/bin", "ied 4 ½ months", "Führer", "   Hello\n    Hello",
  "<s>", "</s>", "<unk>", "<|endoftext|>", "text <|endoftext|> more", "<|user|>\nHi<|end|>\n<|assistant|>",
  "<s> [INST] hi [/INST]", "a</s>b", "<|im_start|>user\nhello<|im_end|>", "▁▁ already escaped ▁x",
  "zero\u200bwidth\u00a0nbsp\u3000ideographic", "control \u0001\u0002 chars \u007f",
];

// Plus seeded random strings from a pool that mixes the hard cases (runs of
// spaces/newlines, digits, apostrophes, combining marks, emoji, CJK, U+2581,
// pieces of special tokens), so every run checks the same "any other text".
const pool = [" ", " ", "  ", "\n", "\t", "\r\n", "a", "e", "the", "The", "ing", "1", "23", "456", "'s", "'LL", ".",
              ",", "!?", "(", ")", "{", "-", "_", "é", "ü", "e\u0301", "ß", "Ж", "ж", "α", "ا", "中", "文", "한",
              "🦙", "😀", "👍🏽", "‍", "\u2581", "\u00a0", "<", ">", "|", "</", "s>", "<|", "|>", "<s>", "</s>",
              "<|end|>", "<|endoftext|>", "\u0001", "\u007f", "\ufffd"];  // (no NUL: argv cannot hold it)
let seed = 12345;
const rand = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
for (let k = 0; k < 24; ++k) {
  let t = "";
  for (let len = 1 + rand(24); len > 0; --len) t += pool[rand(pool.length)];
  texts.push(t);
}

function ours(file, text, noSpecial) {
  const args = ["tokenize", file, "--text", text, "--json"];
  if (noSpecial) args.push("--no-special");
  const r = spawnSync(cli, args, { encoding: "utf8", env: { ...process.env, OMP_WAIT_POLICY: "passive" } });
  if (r.status !== 0) return { error: (r.stderr || "").trim() };
  return JSON.parse(r.stdout).ids;
}

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
let failures = 0, checks = 0;
for (const file of files) {
  const model = await llama.loadModel({ modelPath: file, vocabOnly: true });
  const bos = model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : [];
  for (const text of texts) {
    for (const noSpecial of [true, false]) {
      const ref = noSpecial ? Array.from(model.tokenize(text, false)) : [...bos, ...Array.from(model.tokenize(text, true))];
      const got = ours(file, text, noSpecial);
      ++checks;
      if (JSON.stringify(got) !== JSON.stringify(ref)) {
        ++failures;
        console.log(`MISMATCH ${file} ${noSpecial ? "--no-special" : "(special)"} ${JSON.stringify(text)}\n` +
                    `  llama.cpp:    ${JSON.stringify(ref)}\n  posttrainllm: ${JSON.stringify(got)}`);
      }
    }
  }
  await model.dispose();
}
console.log(`${checks - failures}/${checks} tokenizations identical to llama.cpp`);
process.exit(failures ? 1 : 0);
