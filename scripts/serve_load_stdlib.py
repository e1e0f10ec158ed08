#!/usr/bin/env python3
"""K concurrent streamed completions against URL (stdlib only: the device has no Node;
scripts/serve_load.mjs is the full client). Client-side inter-token gaps are arrival times of
SSE lines (every token's event, its text empty or not), so events that arrive in one read show
gaps near 0.
Prints one JSON line: requests, failed, tokens, seconds, tokens/s, inter-token p50/p99 (ms),
and the texts (for comparing runs). usage: serve_load_stdlib.py URL K TOKENS [JSON-EXTRA]
PTLLM_LOAD_TRACE=FILE: every event's arrival ("request monotonic_us" lines, as serve_load.mjs
writes them), for scripts/serve_trace_report.py beside the server's PTLLM_SERVE_TRACE.
PTLLM_LOAD_TEXTS=FILE: every request's whole text, as a JSON list in request order."""
import http.client, json, os, sys, threading, time, urllib.parse

url, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
u = urllib.parse.urlparse(url)
res = [None] * k

def one(i):
    body = {"prompt": "Once upon a time", "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    body.update(extra)
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res[i] = {"error": r.status, "body": r.read().decode()[:300]}; return
        text, times, mono = "", [], []
        while True:
            line = r.readline()
            if not line: break
            line = line.strip()
            if not line.startswith(b"data: "): continue
            d = line[6:]
            if d == b"[DONE]": break
            e = json.loads(d)
            if e.get("usage") or not e.get("choices"): continue  # the final chunk: usage, no token
            # Every token's event counts, also one whose text is empty (text held back until a
            # UTF-8 character or a possible stop string completes), as serve_load.mjs counts them.
            text += e["choices"][0].get("text", "")
            times.append(time.perf_counter()); mono.append(time.monotonic_ns() // 1000)
        res[i] = {"text": text, "times": times, "mono": mono}
    except Exception as ex:  # noqa
        res[i] = {"error": str(ex)}

t0 = time.perf_counter()
th = [threading.Thread(target=one, args=(i,)) for i in range(k)]
for t in th: t.start()
for t in th: t.join()
secs = time.perf_counter() - t0
ok = [r for r in res if r and "text" in r]
gaps = sorted(1000 * (b - a) for r in ok for a, b in zip(r["times"], r["times"][1:]))
q = lambda p: gaps[min(len(gaps) - 1, int(p * len(gaps)))] if gaps else None
tokens = sum(len(r["times"]) for r in ok)
print(json.dumps({"requests": k, "failed": k - len(ok), "errors": [r for r in res if r and "error" in r][:3],
                  "events": tokens, "seconds": round(secs, 2), "events_per_s": round(tokens / secs, 1),
                  "itl_ms_p50": q(0.5), "itl_ms_p99": q(0.99), "distinct_texts": len({r["text"] for r in ok}),
                  "texts": sorted({r["text"] for r in ok})[:2]}))
if os.environ.get("PTLLM_LOAD_TEXTS"):
    with open(os.environ["PTLLM_LOAD_TEXTS"], "w") as f:
        json.dump([(r or {}).get("text") for r in res], f)
if os.environ.get("PTLLM_LOAD_TRACE"):
    with open(os.environ["PTLLM_LOAD_TRACE"], "w") as f:
        for i, r in enumerate(res):
            for t in (r or {}).get("mono", []):
                f.write(f"{i} {t}\n")
