#!/usr/bin/env python3
"""ncu --csv output (gpu__time_duration.sum, dram__bytes_read.sum, launch__grid_size,
launch__registers_per_thread per kernel launch) as one line per kernel name, grid and
registers: launches, time per launch, share of the time, DRAM MB per launch and GB/s.
Used by scripts/cuda_step_device.sh and scripts/cuda_fold_device.sh on the device."""
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h, rows = rows[0], rows[1:]
ki, mi, vi, ui, ii = (h.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit", "ID"))
per = collections.defaultdict(dict)
for r in rows:
    per[(int(r[ii]), r[ki].split("(")[0][-40:])][r[mi]] = (r[vi].replace(",", ""), r[ui])
T = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}
Bu = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
for (i, k), m in per.items():
    t = float(m["gpu__time_duration.sum"][0]) * T[m["gpu__time_duration.sum"][1]]
    b = float(m["dram__bytes_read.sum"][0]) * Bu[m["dram__bytes_read.sum"][1]]
    a = agg[(k, m["launch__grid_size"][0], m["launch__registers_per_thread"][0])]
    a[0] += 1; a[1] += t; a[2] += b
tot = sum(a[1] for a in agg.values())
print("kernel time %.1f us over %d launches" % (tot, sum(a[0] for a in agg.values())))
for (k, g, r), a in sorted(agg.items(), key=lambda x: -x[1][1]):
    print("%-42s grid %5s regs %4s n=%3d us/launch %7.2f (%4.1f%%) MB/launch %7.2f GB/s %6.0f"
          % (k, g, r, a[0], a[1] / a[0], 100 * a[1] / tot, a[2] / a[0] / 1e6, a[2] / a[1] / 1e3))
