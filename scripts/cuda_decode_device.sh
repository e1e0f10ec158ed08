#!/usr/bin/env bash
# One device run for issue 17's batch-1 decode on the 1B shape (docs/CUDA.md,
# "Session 13"): the GPU tests with the fused GEMV launches (default) and a
# subset without them, then batch-1 decode of a random Llama-3.2-1B-shaped bf16
# model with PTLLM_CUDA_FUSE=0 and =1 alternated, and where nsys or ncu is
# there, the step's kernels by time. Run from a folder holding prebuilt/
# (posttrainllm, cuda_backend_test built with -DPTLLM_SHARED_DIR=/tmp/ptllm-shared-lite;
# lib.tar.gz: the .so files the device lacks), shared-lite/ and
# cuda_device_env.sh. PART=tests|bench|all (default all). Results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PART=${PART:-all}; ROUNDS=${ROUNDS:-3}; N=${N:-128}
. "$(dirname "$0")/cuda_device_env.sh"  # B, cuBLAS, LD_LIBRARY_PATH, device_preamble
device_preamble
if [ "$PART" != bench ]; then
  echo "== tests (defaults: fused GEMV launches)"
  timeout 300 $B/cuda_backend_test --gtest_color=no 2>&1 | grep -v "^\[ RUN\|Google Test trace" |
    tee "$OUT/tests.txt" | grep -v "^\[       OK\|^$"
  echo "== model-level tests with PTLLM_CUDA_FUSE=0 (q, k, v, gate, up, silu_mul launched apart)"
  PTLLM_CUDA_FUSE=0 timeout 200 $B/cuda_backend_test --gtest_color=no \
    --gtest_filter='*Stories260K*:*Llama*:*Qwen*:*Mistral*:*TinyGpt*:*Batch*' 2>&1 |
    grep -v "^\[ RUN\|Google Test trace" | tee "$OUT/tests_unfused.txt" | grep -v "^\[       OK\|^$"
  echo "== the one-row GEMV tests with PTLLM_CUDA_GEMV1=1 (a warp per row), 3 (by row count) and 0 (the old kernel)"
  for g in 1 3 0; do
    PTLLM_CUDA_GEMV1=$g timeout 200 $B/cuda_backend_test --gtest_color=no \
      --gtest_filter='*FusedGemv*:*Stories260K*:*Qwen*:*BatchKiviHeadDim64*' 2>&1 |
      grep -v "^\[ RUN\|Google Test trace" | sed "s/^/PTLLM_CUDA_GEMV1=$g: /" | tee -a "$OUT/tests_gemv1.txt" |
      grep -v "OK \]\|: $\|max rel"
  done
  echo "== sample cpu vs cuda (stories260K, greedy, fused launches)"
  sample_cpu_vs_gpu 100 "--kv-quantize fp16" "--kv-quantize int4 --kivi-group 8 --kivi-residual 16"
fi
[ "$PART" = tests ] && exit 0
# Variants (PTLLM_CUDA_FUSE, PTLLM_CUDA_GEMV1, PTLLM_CUDA_PINNED): 0 0 0 = before session 13;
# 1 0 0 = fused launches; 1 1 1 = and the one-row GEMV kernel (a warp per row) and the logits
# through page-locked memory; 1 2 1 = the row-walking GEMV kernel instead (the default); 1 3 1 =
# a warp per row where the rows fit the resident warps, row-walking above. VARIANTS overrides
# the list (e.g. VARIANTS='"1 1 1" "1 3 1"'; eval'd).
echo "== Llama-3.2-1B shape, bf16, batch 1: the variants alternated ($ROUNDS rounds)"
$B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
for round in $(seq "$ROUNDS"); do
  eval "set -- ${VARIANTS:-\"0 0 0\" \"1 0 0\" \"1 1 1\" \"1 2 1\"}"
  for v in "$@"; do
    set -- $v
    r=$(PTLLM_CUDA_FUSE=$1 PTLLM_CUDA_GEMV1=$2 PTLLM_CUDA_PINNED=$3 timeout 100 $B/posttrainllm bench /tmp/l1b.gguf --device cuda \
        --kv-quantize fp16 -p 0 -n "$N" -r 3 -d 0 --json 2>&1 | tr -d '\n')
    echo "fuse=$1 gemv1=$2 pinned=$3 round=$round $r" >> "$OUT/bench_1b.jsonl"
    echo "$r" | python3 -c "import json,sys; d=json.load(sys.stdin)['decode']; print('round $round fuse=$1 gemv1=$2 pinned=$3 tok/s %.1f +- %.1f  ms/token %.3f  read %.0f GB/s' % (d['tps_mean'], d['tps_sd'], 1000 / d['tps_mean'], d['achieved_read_gb_per_s']))" 2>/dev/null || echo "$r" | cut -c1-300
  done
done
echo "== the same at 4K stored tokens (fp16 and int4 KV), default variant"
for kv in fp16 int4; do
  r=$(timeout 100 $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n "$N" -r 3 -d 4096 --json 2>&1 | tr -d '\n')
  echo "d4096 $kv $r" >> "$OUT/bench_1b.jsonl"
  echo "$r" | python3 -c "import json,sys; d=json.load(sys.stdin)['decode']; print('d4096 $kv tok/s %.1f +- %.1f  read %.0f GB/s' % (d['tps_mean'], d['tps_sd'], d['achieved_read_gb_per_s']))" 2>/dev/null || echo "$r" | cut -c1-300
done
echo "== copy bandwidth (cuda_attn_bench reports the device's copy GB/s)"
timeout 60 $B/cuda_attn_bench 8192 2>&1 | grep -i "bandwidth\|copy" | head -3
# Where a step's time goes: GPU kernel time per step against the wall clock above
# (ncu flushes the caches before each kernel: small kernels read as slower than they run).
for fuse in 0 1; do
  export PTLLM_CUDA_GEMV1=$((2 * fuse)) PTLLM_CUDA_PINNED=$fuse  # 0: before session 13; 1: the default
  if command -v nsys >/dev/null; then
    echo "== nsys, PTLLM_CUDA_FUSE=$fuse, 32 decode steps"
    PTLLM_CUDA_FUSE=$fuse timeout 200 nsys profile -o /tmp/prof$fuse -f true -t cuda --stats=false \
      $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize fp16 -p 0 -n 32 -r 1 -d 0 >/dev/null 2>&1
    nsys stats -q --report cuda_gpu_kern_sum,cuda_api_sum --format csv -o "$OUT/nsys_fuse$fuse" /tmp/prof$fuse.nsys-rep >/dev/null 2>&1
    ls "$OUT"/nsys_fuse$fuse* 2>/dev/null
    for f in "$OUT"/nsys_fuse${fuse}_cuda_gpu_kern_sum.csv "$OUT"/nsys_fuse${fuse}_cuda_api_sum.csv; do
      [ -f "$f" ] && python3 - "$f" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r.get("Total Time (ns)", 0) or 0) for r in rows)
print(sys.argv[1].split("/")[-1], "total %.2f ms" % (tot / 1e6))
for r in rows[:12]:
    print("  %6.1f%%  %8.2f ms  n %6s  %s" % (float(r.get("Time (%)", 0)), float(r["Total Time (ns)"]) / 1e6, r.get("Instances", r.get("Num Calls", "")), (r.get("Name") or "")[:90]))
PY
    done
  elif command -v ncu >/dev/null; then
    echo "== ncu kernel durations, PTLLM_CUDA_FUSE=$fuse, 4 decode steps"
    PTLLM_CUDA_FUSE=$fuse timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum \
      $B/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize fp16 -p 0 -n 4 -r 1 -d 0 > "$OUT/ncu_fuse$fuse.txt" 2>&1
    python3 - "$OUT/ncu_fuse$fuse.txt" <<'PY'
import re, sys, collections
d = collections.defaultdict(list); name = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s+(?:void )?(.*?) \((\d+), (\d+), (\d+)\)x\(", line)
    if m:
        k = re.search(r"(\w+_kernel)", m.group(1)); name = k.group(1) if k else m.group(1)[:40]
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and name:
        v = float(m.group(2).replace(",", "")); d[name].append(v * (1e-3 if m.group(1) == "ns" else 1))
tot = sum(sum(v) for v in d.values())
for k, v in sorted(d.items(), key=lambda kv: -sum(kv[1])):
    print("%-40s n %5d  total %9.1f us  median %7.2f us" % (k, len(v), sum(v), sorted(v)[len(v) // 2]))
print("all kernels: %.1f us" % tot)
PY
  else
    echo "no nsys or ncu here"
  fi
done
