#!/usr/bin/env python3
"""Batched-decode anchor for the CUDA backend (docs/BENCHMARKS.md, issue 17), on
the same GPU: the device's memory bandwidth (torch copy and read), then
transformers' fp16 SDPA decode with a static cache of a random Llama-3.1-8B-shaped
model (optionally fewer layers) at batch B with D tokens already stored per
sequence. The cache is filled untimed by writing random K/V into the static
buffers (positions 0..D-1 are all visible to the causal mask), then `gen` steps of
B tokens are timed (eager forward, greedy argmax). Prints one JSON object per line.

usage: cuda_batch_anchor.py LAYERS BATCH DEPTH GEN"""
import json, sys, time
import torch

layers, batch, depth, gen = (int(a) for a in sys.argv[1:5])


def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


n = 2 << 30  # 4 GiB of fp16
x = torch.empty(n, dtype=torch.float16, device="cuda")
y = torch.empty_like(x)
x.normal_()
t_copy = timed(lambda: y.copy_(x), 10)
t_read = timed(lambda: x.sum(dtype=torch.float32), 10)
print(json.dumps({"what": "bandwidth", "copy_GBps": 2 * n * 2 / t_copy / 1e9, "read_GBps": n * 2 / t_read / 1e9,
                  "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "torch_cuda": torch.version.cuda}), flush=True)
del x, y
torch.cuda.empty_cache()

import transformers
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                  rope_theta=500000.0, tie_word_embeddings=False, rms_norm_eps=1e-5)
cfg._attn_implementation = "sdpa"
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.float16).eval()
wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
cache = StaticCache(config=cfg, max_cache_len=depth + gen + 8)
with torch.no_grad():
    # Initialise the static buffers at this batch (one token at position 0), then fill them untimed.
    tok = torch.randint(3, cfg.vocab_size, (batch, 1), device="cuda")
    model(input_ids=tok, past_key_values=cache, cache_position=torch.tensor([0], device="cuda"), use_cache=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    kv_bytes = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            t.normal_(generator=g)
            kv_bytes += t.numel() * t.element_size()

    def step(pos):
        global tok
        out = model(input_ids=tok, past_key_values=cache, cache_position=torch.tensor([pos], device="cuda"),
                    use_cache=True)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)

    for i in range(4):  # warm-up steps (untimed)
        step(depth + i)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(4, gen):
        step(depth + i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
stored_bytes = 2 * layers * batch * cfg.num_key_value_heads * depth * cfg.head_dim * 2
print(json.dumps({"what": "transformers_fp16_sdpa_static_batch_decode", "transformers": transformers.__version__,
                  "shape": "llama-3.1-8b", "layers": layers, "batch": batch, "depth": depth,
                  "timed_steps": gen - 4, "tok_per_s": batch * (gen - 4) / dt, "ms_per_step": 1000 * dt / (gen - 4),
                  "weight_bytes": wbytes, "static_cache_bytes": kv_bytes, "stored_kv_bytes": stored_bytes,
                  "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
