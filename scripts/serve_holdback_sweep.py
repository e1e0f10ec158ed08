#!/usr/bin/env python3
"""How the text itself sets one stream's inter-token p99: one `posttrainllm serve` (with its
per-step trace, PTLLM_SERVE_TRACE), then SEEDS streamed completions one after another, each
TOKENS tokens from "Once upon a time" at TEMPERATURE with its own seed (as serve_load.mjs
sends them). Per request: the token events (tokens minus events = tokens whose text was held
back, e.g. a UTF-8 character split over byte tokens), and each client gap placed against the
server's steps: a gap over two or more steps is held-back text or a late delivery (the
server's writer or the client not scheduled in time). At one stream a request's p99 (nearest
rank, 199 gaps) is its second-largest gap, so two such gaps set it.
Prints per request, then the summary (docs/SERVER.md, "Session 26").
usage: scripts/serve_holdback_sweep.py [SEEDS=40] [TOKENS=200] [TEMPERATURE=0.8]
env: BIN (build/app/posttrainllm), MODEL (models/flagship-27m), THREADS (2)."""
import bisect
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 200
temperature = float(sys.argv[3]) if len(sys.argv) > 3 else 0.8
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
bin_ = os.environ.get('BIN', os.path.join(root, 'build/app/posttrainllm'))
model = os.environ.get('MODEL', os.path.join(root, 'models/flagship-27m'))


def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float('nan')


work = tempfile.mkdtemp()
trace = os.path.join(work, 'trace.txt')
log = open(os.path.join(work, 'serve.log'), 'w+')
srv = subprocess.Popen([bin_, 'serve', model, '--port', '0', '--threads', os.environ.get('THREADS', '2')],
                       stderr=log, env={**os.environ, 'PTLLM_SERVE_TRACE': trace})
try:
    port = None
    for _ in range(300):
        log.seek(0)
        m = re.search(r'http://[0-9.]+:([0-9]+)', log.read())
        if m:
            port = int(m.group(1))
            break
        if srv.poll() is not None:
            break
        time.sleep(0.1)
    if port is None:
        log.seek(0)
        sys.exit('serve_holdback_sweep: the server did not start: ' + log.read()[-500:])

    def one(seed):
        body = {'prompt': 'Once upon a time', 'max_tokens': tokens, 'temperature': temperature, 'seed': seed,
                'ignore_eos': True, 'stream': True}
        c = http.client.HTTPConnection('127.0.0.1', port, timeout=300)
        c.request('POST', '/v1/completions', json.dumps(body), {'Content-Type': 'application/json'})
        r = c.getresponse()
        if r.status != 200:
            sys.exit(f'seed {seed}: HTTP {r.status}: {r.read()[:300]!r}')
        times, text, used = [], '', None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b'data: ') or line == b'data: [DONE]':
                continue
            e = json.loads(line[6:])
            if e.get('usage'):
                used = e['usage']['completion_tokens']
                continue
            if e.get('choices'):
                text += e['choices'][0].get('text', '')
                times.append(time.monotonic_ns() // 1000)
        return times, text, used

    one(10**6)  # warm-up (untimed)
    reqs = [one(s) for s in range(seeds)]
finally:
    srv.terminate()
    srv.wait()
steps = [list(map(int, l.split())) for l in open(trace) if l.strip()]
ends = sorted(s[0] + s[1] + s[2] for s in steps)
step_ms = statistics.median(s[2] / 1000 for s in steps)
rows, one_step = [], []
for seed, (times, text, used) in enumerate(reqs):
    gaps = [((b - a) / 1000, bisect.bisect_right(ends, b) - bisect.bisect_right(ends, a)) for a, b in zip(times, times[1:])]
    held = [g for g, k in gaps if k >= 2]
    one_step += [g for g, k in gaps if k == 1]
    non_ascii = sum(ord(ch) > 127 for ch in text)
    p99 = q([g for g, _ in gaps], 0.99)
    rows.append((seed, len(times), used, non_ascii, len(held), p99, max(g for g, _ in gaps)))
print(f'{seeds} requests of {tokens} tokens, temperature {temperature}, one at a time; '
      f'server decode step median {step_ms:.2f} ms')
print('seed  events  tokens  non-ASCII chars  gaps over 2+ steps  p99 ms  max ms')
for r in rows:
    print(f'{r[0]:4d}  {r[1]:6d}  {r[2]:6d}  {r[3]:15d}  {r[4]:18d}  {r[5]:6.2f}  {r[6]:6.2f}')
n_le1 = sum(r[4] <= 1 for r in rows)
print(f'requests with at most one gap over 2+ steps: {n_le1} of {len(rows)}; '
      f'tokens held back: {sum(r[2] - r[1] for r in rows)} of {sum(r[2] for r in rows)}')
print(f'gaps over 2+ steps per request: median {statistics.median(r[4] for r in rows)}, '
      f'max {max(r[4] for r in rows)}')
print(f'request p99: median {statistics.median(r[5] for r in rows):.2f} ms; '
      f'among requests with <= 1 gap over 2+ steps: '
      f'{statistics.median([r[5] for r in rows if r[4] <= 1]) if n_le1 else float("nan"):.2f} ms')
print(f'one-step gaps (all requests, {len(one_step)}): p50 {q(one_step, .5):.2f} p99 {q(one_step, .99):.2f} '
      f'max {max(one_step):.2f} ms')
