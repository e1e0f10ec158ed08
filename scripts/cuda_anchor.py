#!/usr/bin/env python3
"""Anchors for the CUDA backend (docs/BENCHMARKS.md, issue 17), on the same GPU:
the device's memory bandwidth (torch copy and read) and transformers' fp16 SDPA
static-cache greedy decode of a random Llama-3.2-1B-shaped model.
Prints one JSON object per line."""
import json, sys, time
import torch

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
                  "device": torch.cuda.get_device_name()}), flush=True)
del x, y
torch.cuda.empty_cache()

from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                  rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
cfg._attn_implementation = "sdpa"
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.float16).eval()
gen = int(sys.argv[1]) if len(sys.argv) > 1 else 128
for batch in (1,):
    ids = torch.randint(0, 128256, (batch, 16), device="cuda")
    kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, cache_implementation="static")
    # eager, and with the forward compiled as transformers does for a static
    # cache; each timed run follows an identical untimed one (compilation).
    for compiled in (False, True):
        k2 = dict(kw, disable_compile=not compiled)
        with torch.no_grad():
            model.generate(ids, **k2)
            torch.cuda.synchronize(); t = time.perf_counter()
            model.generate(ids, **k2)
            torch.cuda.synchronize(); dt = time.perf_counter() - t
        print(json.dumps({"what": "transformers_fp16_sdpa_static_decode", "compiled": compiled,
                          "shape": "llama-3.2-1b", "batch": batch, "prompt": 16, "gen": gen,
                          "tok_per_s": batch * gen / dt,
                          "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}), flush=True)
