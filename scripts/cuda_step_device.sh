#!/usr/bin/env bash
# Session 24 on the H200 (docs/CUDA.md, "Session 24"): graphs on CPU-vs-GPU greedy text with
# StreamingLLM settings; PTLLM_CUDA_GRAPH=0/1 alternated on launch-bound small models
# (stories260K, the 1B width with 2 layers); then ncu per-kernel durations and DRAM reads over
# ~2 decode steps of the 1B shape (graphs off), summed per kernel. Staged and run as
# scripts/cuda_graph_device.sh is (prebuilt/, shared-lite/, cuda_device_env.sh beside it).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. "$(dirname "$0")/cuda_device_env.sh"
device_preamble
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
[ -f /tmp/l1b.gguf ] || $B/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -1
echo "== sample cpu vs cuda with graphs on, StreamingLLM settings"
PTLLM_CUDA_GRAPH=1 sample_cpu_vs_gpu 200 "--kv-quantize fp16 --streaming-llm-sink 4 --streaming-llm-window 40" \
  "--kv-quantize int4 --kivi-group 8 --kivi-residual 16 --streaming-llm-sink 4 --streaming-llm-window 40"
echo "== small models (launch-bound): graphs off / on alternated"
[ -f /tmp/small.gguf ] || $B/posttrainllm make-random /tmp/small.gguf --preset llama-3.2-1b --layers 2 --vocab 32000 --type bf16 2>&1 | tail -1
for r in 1 2 3; do for g in 0 1; do
  for m in shared-lite/models/stories260K /tmp/small.gguf; do
    PTLLM_CUDA_GRAPH=$g timeout 60 $B/posttrainllm bench $m --device cuda -p 0 -n 256 -r 3 --json 2>&1 | tr -d '\n' | tee -a "$OUT/small_ab.jsonl" | show "r$r graph=$g $(basename $m)"; echo >> "$OUT/small_ab.jsonl"
  done
done; done
# kernel-level timeline without ncu: bench as is
timeout 60 $B/posttrainllm bench /tmp/l1b.gguf --device cuda -p 0 -n 128 -r 2 --json 2>&1 | show "b1 d0 fp16 plain"
# ncu: every kernel of 2 decode steps (skip warm-up), per-kernel duration and DRAM throughput
timeout 300 $NCU --launch-skip 600 --launch-count 240 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio \
  --csv $B/posttrainllm bench /tmp/l1b.gguf --device cuda -p 0 -n 8 -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc $?"; tail -3 "$OUT/ncu.err"
python3 "$(dirname "$0")/ncu_kernel_table.py" "$OUT/ncu.csv"
