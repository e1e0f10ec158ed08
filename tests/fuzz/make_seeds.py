#!/usr/bin/env python3
"""Writes the seed corpora in tests/fuzz/corpus/<target>/ (run once; the
output is committed). Sources: the repo's models, ../shared fixtures, and tiny
hand-built safetensors/.tinygpt files (struct only, no numpy)."""
import json, os, struct, sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
SHARED = os.path.abspath(os.environ.get("PTLLM_SHARED_DIR", os.path.join(REPO, "..", "shared")))
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


DT = {"F32": ("f", 4), "F16": ("e", 2), "I32": ("i", 4), "I8": ("b", 1), "I64": ("q", 8)}


def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, values)."""
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape, vals in tensors:
        if dt == "BF16":
            raw = b"".join(struct.pack("<f", v)[2:] for v in vals)
        else:
            fmt, _ = DT[dt]
            raw = struct.pack("<%d%s" % (len(vals), fmt), *vals)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def vals(n, scale=0.1):
    return [scale * (((i * 37) % 11) - 5) / 5.0 for i in range(n)]


def micro_tokenizer():
    # Byte-fallback SentencePiece-style BPE over a handful of pieces.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(3):  # a few byte pieces
        vocab["<0x%02X>" % (0x41 + b)] = len(vocab)
    for p in ["\u2581", "o", "n", "c", "e", "on", "\u2581o", "\u2581on"]:
        vocab[p] = len(vocab)
    return {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": c, "special": True, "normalized": False, "lstrip": False,
                          "rstrip": False, "single_word": False} for c, i in [("<unk>", 0), ("<s>", 1), ("</s>", 2)]],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                    {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
                  "vocab": vocab, "merges": ["o n", "\u2581 o", "\u2581o n"]},
    }


def bytelevel_tokenizer():
    # GPT-2 style: every byte mapped to a printable code point, a few merges.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): i for i, c in enumerate(cs)}
    for m in ["\u0120t", "he", "\u0120the"]:
        vocab[m] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return {
        "version": "1.0",
        "added_tokens": [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "special": True,
                          "normalized": False, "lstrip": False, "rstrip": False, "single_word": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                  "merges": [["\u0120", "t"], ["h", "e"], ["\u0120t", "he"]]},
    }


def tinygpt(yoco=False, tokenizer=None, dtype="F32", tie=False):
    V, D, L, H, KV, HD, F, CTX = 17, 4, 2, 2, 1, 2, 6, 16
    cfg = {"arch": "tinygpt", "vocab_size": V, "d_model": D, "n_layers": L, "n_heads": H, "n_kv_heads": KV,
           "head_dim": HD, "ffn_dim": F, "context_length": CTX, "rope_theta": 10000.0, "norm_eps": 1e-5,
           "tie_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2}
    if yoco:
        cfg["yoco"] = {"self_layers": 1, "self_window": 4}
    t = [("tok_embeddings.weight", dtype, [V, D], vals(V * D)), ("norm.weight", dtype, [D], [1.0] * D)]
    if not tie:
        t.append(("output.weight", dtype, [V, D], vals(V * D, 0.2)))
    for l in range(L):
        p = "layers.%d." % l
        t += [(p + "attn_norm.weight", dtype, [D], [1.0] * D), (p + "attn.wq.weight", dtype, [H * HD, D], vals(H * HD * D))]
        if not yoco or l < 1:
            t += [(p + "attn.wk.weight", dtype, [KV * HD, D], vals(KV * HD * D)),
                  (p + "attn.wv.weight", dtype, [KV * HD, D], vals(KV * HD * D))]
        t += [(p + "attn.wo.weight", dtype, [D, H * HD], vals(D * H * HD)), (p + "ffn_norm.weight", dtype, [D], [1.0] * D),
              (p + "ffn.w_gate.weight", dtype, [F, D], vals(F * D)), (p + "ffn.w_up.weight", dtype, [F, D], vals(F * D)),
              (p + "ffn.w_down.weight", dtype, [D, F], vals(D * F))]
    if yoco:
        t += [("yoco.kv_norm.weight", dtype, [D], [1.0] * D), ("yoco.wk.weight", dtype, [KV * HD, D], vals(KV * HD * D)),
              ("yoco.wv.weight", dtype, [KV * HD, D], vals(KV * HD * D))]
    meta = {"format": "tinygpt", "version": "1", "config": json.dumps(cfg)}
    if tokenizer:
        meta["tokenizer"] = json.dumps(tokenizer, separators=(",", ":"))
    return safetensors(t, meta), cfg


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def gguf(kvs, tensors, alignment=32, version=3):
    """kvs: list of (key, type id, payload bytes); tensors: (name, ne innermost first, ggml type, data bytes)."""
    def string(s):
        s = s.encode() if isinstance(s, str) else s
        return struct.pack("<Q", len(s)) + s
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, payload in kvs:
        out += string(k) + struct.pack("<I", t) + payload
    off, blobs = 0, []
    for name, ne, t, raw in tensors:
        out += string(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", t, off)
        raw += b"\0" * (-len(raw) % alignment)
        blobs.append(raw)
        off += len(raw)
    out += b"\0" * (-len(out) % alignment)
    return out + b"".join(blobs)


def gguf_seeds():
    s = lambda x: struct.pack("<Q", len(x.encode())) + x.encode()
    arr = lambda t, fmt, v: struct.pack("<IQ", t, len(v)) + struct.pack("<%d%s" % (len(v), fmt), *v)
    every = [("general.architecture", 8, s("llama")), ("u8", 0, b"\x07"), ("i8", 1, b"\xff"), ("u16", 2, b"\x01\x02"),
             ("i16", 3, b"\xff\xff"), ("u32", 4, struct.pack("<I", 5)), ("i32", 5, struct.pack("<i", -5)),
             ("f32", 6, struct.pack("<f", 1e-5)), ("bool", 7, b"\x01"), ("u64", 10, struct.pack("<Q", 1 << 40)),
             ("i64", 11, struct.pack("<q", -1)), ("f64", 12, struct.pack("<d", 0.5)),
             ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + s("<unk>") + s("<s>") + s("\u2581a")),
             ("tokenizer.ggml.scores", 9, arr(6, "f", [0.0, -1.0, -2.0])),
             ("tokenizer.ggml.token_type", 9, arr(5, "i", [2, 3, 1])), ("u64s", 9, arr(10, "Q", [1, 2]))]
    f32 = lambda n: struct.pack("<%df" % n, *vals(n))
    put("gguf", "every_type.gguf", gguf(every, [("w", [4, 2], 0, f32(8)), ("h", [8], 1, b"\x00\x3c" * 8)]))
    put("gguf", "v2_no_tensors.gguf", gguf(every[:3], [], version=2))
    put("gguf", "align64_bf16.gguf", gguf([("general.alignment", 4, struct.pack("<I", 64))],
                                          [("b", [2, 2], 30, b"\x80\x3f" * 4), ("c", [3], 0, f32(3))], alignment=64))
    blocks = lambda t, nbytes: bytes((i * 13) & 0xff for i in range(nbytes))
    put("gguf", "quantised.gguf", gguf([], [("q8", [32, 2], 8, blocks(8, 68)), ("q4", [32], 2, blocks(2, 18)),
                                            ("q4k", [256], 12, blocks(12, 144)), ("q6k", [256], 14, blocks(14, 210)),
                                            ("q5_1", [32], 7, blocks(7, 24))]))
    # stories260K's header (metadata + 48 tensor infos, no data): real tokenizer arrays.
    p = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")
    with open(p, "rb") as f:
        put("gguf", "stories260K_header.gguf", f.read(14176))


def gguf_model_seeds():
    """Micro llama / qwen2 GGUF models (hidden 8, 1 layer, 2 heads / 1 KV head of 4, FFN 16, vocab 16, F32)."""
    u32 = lambda v: struct.pack("<I", v)
    f32s = lambda n: struct.pack("<%df" % n, *vals(n))
    for arch, bias, tied in [("llama", False, False), ("qwen2", True, True)]:
        kv = [("general.architecture", 8, struct.pack("<Q", len(arch)) + arch.encode())]
        for k, v in [("context_length", 64), ("embedding_length", 8), ("block_count", 1), ("feed_forward_length", 16),
                     ("attention.head_count", 2), ("attention.head_count_kv", 1), ("attention.key_length", 4)]:
            kv.append(("%s.%s" % (arch, k), 4, u32(v)))
        kv.append(("%s.attention.layer_norm_rms_epsilon" % arch, 6, struct.pack("<f", 1e-5)))
        kv.append(("%s.rope.freq_base" % arch, 6, struct.pack("<f", 10000.0)))
        kv.append(("tokenizer.ggml.bos_token_id", 4, u32(1)))
        kv.append(("tokenizer.ggml.eos_token_id", 4, u32(2)))
        t = [("token_embd.weight", [8, 16], 0, f32s(128)), ("output_norm.weight", [8], 0, f32s(8))]
        if not tied:
            t.append(("output.weight", [8, 16], 0, f32s(128)))
        for n, ne in [("attn_norm.weight", [8]), ("attn_q.weight", [8, 8]), ("attn_k.weight", [8, 4]),
                      ("attn_v.weight", [8, 4]), ("attn_output.weight", [8, 8]), ("ffn_norm.weight", [8]),
                      ("ffn_gate.weight", [8, 16]), ("ffn_up.weight", [8, 16]), ("ffn_down.weight", [16, 8])]:
            t.append(("blk.0." + n, ne, 0, f32s(ne[0] * (ne[1] if len(ne) > 1 else 1))))
        if bias:
            for n, k in [("attn_q.bias", 8), ("attn_k.bias", 4), ("attn_v.bias", 4)]:
                t.append(("blk.0." + n, [k], 0, f32s(k)))
        put("gguf_model", "micro_%s.gguf" % arch, gguf(kv, t))
    put("gguf_model", "llama3_rope_freqs.gguf", gguf(kv[:0] + [("general.architecture", 8, struct.pack("<Q", 5) + b"llama")] +
        [(k.replace("qwen2", "llama"), ty, v) for k, ty, v in kv[1:]], t[:2] + [("rope_freqs.weight", [2], 0, struct.pack("<2f", 1.0, 8.0))] +
        [x for x in t[2:] if "bias" not in x[0]]))


def main():
    # safetensors: every dtype, empty and scalar tensors, metadata, unpadded header.
    put("safetensors", "f32_2x3", safetensors([("w", "F32", [2, 3], vals(6))]))
    put("safetensors", "mixed", safetensors([("a", "F16", [4], vals(4)), ("b", "BF16", [2, 2], vals(4)),
                                              ("c", "I8", [3], [1, -2, 3]), ("d", "I32", [1], [7]),
                                              ("e", "I64", [2], [1, 2])], {"k": "v"}))
    put("safetensors", "empty_and_scalar", safetensors([("z", "F32", [0, 4], []), ("s", "F32", [], [1.5])]))
    put("safetensors", "unpadded", safetensors([("w", "F32", [3], vals(3))], pad=False))
    put("safetensors", "header_only", safetensors([], {"format": "pt"}))
    # sharded index: index JSON, NUL, shard a.safetensors (b.safetensors is fixed by the target).
    shard = safetensors([("a.weight", "F32", [2, 2], vals(4))])
    for name, wm in [("both", {"a.weight": "a.safetensors", "b.weight": "b.safetensors"}),
                     ("only_b", {"b.weight": "b.safetensors"}),
                     ("missing_tensor", {"a.weight": "a.safetensors", "x": "a.safetensors"})]:
        put("safetensors_index", name, json.dumps({"metadata": {"total_size": 32}, "weight_map": wm}).encode() + b"\0" + shard)
    put("safetensors_index", "flagship_index", open(os.path.join(REPO, "models/flagship-27m/model.safetensors.index.json"), "rb").read())
    # config.json: the repo's and the fixtures' configs.
    put("hf_config", "stories260K.json", open(os.path.join(REPO, "models/stories260K/config.json"), "rb").read())
    put("hf_config", "flagship-27m.json", open(os.path.join(REPO, "models/flagship-27m/config.json"), "rb").read())
    hf = os.path.join(SHARED, "fixtures", "hf")
    for fam in sorted(os.listdir(hf)):
        put("hf_config", fam + ".json", open(os.path.join(hf, fam, "config.json"), "rb").read())
    # .tinygpt config metadata: from the fixtures and the bundled models.
    tg = os.path.join(SHARED, "fixtures", "tinygpt")
    for f in sorted(os.listdir(tg)):
        if f.endswith(".tinygpt"):
            put("tinygpt_config", f[:-8] + ".json", read_header(os.path.join(tg, f))["__metadata__"]["config"])
    for f in ["flagship-27m.tinygpt", "flagship-yoco-27m.tinygpt"]:
        p = os.path.join(REPO, "models", f)
        if os.path.exists(p):
            put("tinygpt_config", f[:-8] + ".json", read_header(p)["__metadata__"]["config"])
    # whole .tinygpt files: micro models (17-token vocab, d_model 4, 2 layers).
    put("tinygpt_file", "plain.tinygpt", tinygpt()[0])
    put("tinygpt_file", "yoco.tinygpt", tinygpt(yoco=True)[0])
    put("tinygpt_file", "tied_bf16.tinygpt", tinygpt(dtype="BF16", tie=True)[0])
    put("tinygpt_file", "with_tokenizer.tinygpt", tinygpt(tokenizer=micro_tokenizer())[0])
    gguf_seeds()
    gguf_model_seeds()
    # tokenizer.json (+ NUL + tokenizer_config.json).
    put("tokenizer_json", "micro_spm.json", json.dumps(micro_tokenizer()))
    put("tokenizer_json", "micro_bytelevel.json", json.dumps(bytelevel_tokenizer()))
    put("tokenizer_json", "micro_spm_config.json", json.dumps(micro_tokenizer()) + "\0" +
        json.dumps({"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    put("tokenizer_json", "stories260K.json", open(os.path.join(REPO, "models/stories260K/tokenizer.json"), "rb").read())
    # prompts: fixture test texts plus edge cases.
    texts = ["Once upon a time", "", " ", "  leading and trailing  ", "<s>hello</s><unk>", "<|endoftext|>x",
             "\u2581\u2581 metaspace", "tabs\tand\nnewlines\r\n", "caf\u00e9 na\u00efve \u00bd \U0001F600 \u4e2d\u6587",
             "12345 3.14 1e10", "'s 've 're 'll", "\u00a0nbsp\u2009thin", "a" * 200]
    for name in ["llama3", "qwen3"]:
        p = os.path.join(SHARED, "fixtures", "tokenizers", name, "cases.json")
        texts += [c["text"] for c in json.load(open(p))["cases"][:12]]
    for i, t in enumerate(texts):
        put("prompt", "p%02d" % i, t)
    put("prompt", "bad_utf8", b"ok \xff\xfe \xc3 \xe2\x96 \xed\xa0\x80 \xf4\x90\x80\x80 end")


if __name__ == "__main__":
    main()
