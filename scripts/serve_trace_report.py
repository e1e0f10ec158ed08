#!/usr/bin/env python3
"""Where a served stream's inter-token time goes: the server's per-step trace
(PTLLM_SERVE_TRACE) beside the client's event arrivals (serve_load.mjs with
PTLLM_LOAD_TRACE), both on CLOCK_MONOTONIC.
  PTLLM_SERVE_TRACE=/tmp/s.txt posttrainllm serve ... &
  PTLLM_LOAD_TRACE=/tmp/c.txt node scripts/serve_load.mjs URL ...
  scripts/serve_trace_report.py /tmp/s.txt /tmp/c.txt
Prints the step and client-gap distributions, the slowest steps, the delivery delay and the
client's gaps grouped by how many server steps each spans. serve_load_stdlib.py writes the
same client trace with PTLLM_LOAD_TRACE."""
import collections
import statistics
import sys


def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float('nan')


steps = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
if not steps:
    sys.exit('no steps in ' + sys.argv[1])
t0 = steps[0][0]
busy = [(s[1] + s[2]) / 1000 for s in steps]
dec = [s[2] / 1000 for s in steps]
gap = [(b[0] - a[0]) / 1000 for a, b in zip(steps, steps[1:])]
print(f'{len(steps)} steps')
for name, v in (('decode ms', dec), ('admit+prefill+decode ms', busy), ('step start to next ms', gap)):
    print(f'  {name:24s} p50 {q(v, .5):7.2f}  p90 {q(v, .9):7.2f}  p99 {q(v, .99):7.2f}  max {max(v):7.2f}')
med = statistics.median(busy)
slow = [(i, s) for i, s in enumerate(steps) if (s[1] + s[2]) / 1000 > 2.5 * med]
print(f'  steps over 2.5x the median ({med:.2f} ms): {len(slow)}')
for i, s in slow[:20]:
    print(f'    step {i:5d} at {(s[0] - t0) / 1000:9.1f} ms: admit+prefill {s[1] / 1000:7.1f}, decode {s[2] / 1000:7.1f}, running {s[3]}')
if len(sys.argv) > 2:
    ev = collections.defaultdict(list)
    for l in open(sys.argv[2]):
        if l.strip():
            i, t = map(int, l.split())
            ev[i].append(t)
    g = [(b - a) / 1000 for ts in ev.values() for a, b in zip(ts, ts[1:])]
    print(f'client: {len(ev)} streams, {len(g)} gaps: p50 {q(g, .5):.2f}  p90 {q(g, .9):.2f}  p99 {q(g, .99):.2f}  max {max(g):.2f} ms')
    # Delivery: each event's arrival after the end of the latest step before it.
    import bisect
    ends = sorted(s[0] + s[1] + s[2] for s in steps)
    d = []
    for ts in ev.values():
        for t in ts:
            k = bisect.bisect_right(ends, t) - 1
            if k >= 0:
                d.append((t - ends[k]) / 1000)
    if d:
        print(f'delivery (event after its step ended): p50 {q(d, .5):.2f}  p90 {q(d, .9):.2f}  p99 {q(d, .99):.2f}  max {max(d):.2f} ms')
    # Each client gap by the number of server steps that ended between its two events: a gap
    # over several steps is text held back (a UTF-8 character split over byte tokens, or a
    # possible stop string), sent in one event when it completes; a one-step gap is the
    # step and the delivery alone.
    span = collections.defaultdict(list)
    for ts in ev.values():
        for a, b in zip(ts, ts[1:]):
            k = bisect.bisect_right(ends, b) - bisect.bisect_right(ends, a)
            span[min(k, 4)].append((b - a) / 1000)
    for k in sorted(span):
        v = span[k]
        label = f'{k} steps' if k < 4 else '4+ steps'
        print(f'gaps over {label:8s}: {len(v):5d}  p50 {q(v, .5):6.2f}  p99 {q(v, .99):6.2f}  max {max(v):6.2f} ms')
