#!/usr/bin/env bash
# One device run for the CUDA backend (issue 17): GPU tests (label cuda), CLI
# checks, and the measurements of docs/BENCHMARKS.md. Run from a tree that has
# shared-lite/ (fixtures) and, optionally, prebuilt/ (binaries built elsewhere
# with -DPTLLM_SHARED_DIR=shared-lite); results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv | tee "$OUT/gpu.txt"
BIN=prebuilt
# The prebuilt test binary looks for its fixtures at the path it was configured with.
mkdir -p /work/wt-cuda/build-cuda && ln -sfn "$PWD/shared-lite" /work/wt-cuda/build-cuda/shared-lite
export LD_LIBRARY_PATH=$PWD/prebuilt/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
if ! $BIN/posttrainllm --help >/dev/null 2>&1; then
  echo "prebuilt binaries do not run here; building"; ldd $BIN/posttrainllm | grep "not found"
  cmake -S . -B build -G Ninja -DPTLLM_SHARED_DIR=shared-lite -DPTLLM_BUILD_BENCH=OFF && \
    cmake --build build -j16 --target posttrainllm cuda_backend_test || exit 1
  mkdir -p b2 && cp build/app/posttrainllm build/tests/cuda/cuda_backend_test b2/ && BIN=b2
fi
echo "== tests"; $BIN/cuda_backend_test 2>&1 | grep -v "^\[ RUN\|Google Test trace"
echo "== sample cpu vs cuda (stories260K, greedy)"
M=shared-lite/models/stories260K
$BIN/posttrainllm sample $M -p "Once upon a time" -n 60 -t 0 --kv-quantize fp16 > "$OUT/sample_cpu.txt" 2>/dev/null
$BIN/posttrainllm sample $M -p "Once upon a time" -n 60 -t 0 --kv-quantize fp16 --device cuda > "$OUT/sample_cuda.txt" 2>/dev/null
cat "$OUT/sample_cuda.txt" | head -5
cmp "$OUT/sample_cpu.txt" "$OUT/sample_cuda.txt" && echo "sample text identical" || diff "$OUT/sample_cpu.txt" "$OUT/sample_cuda.txt" | head
[ -n "${TESTS_ONLY:-}" ] && exit 0
echo "== 1B-shaped random model, single-sequence decode"
$BIN/posttrainllm make-random /tmp/l1b.gguf --preset llama-3.2-1b --type bf16 2>&1 | tail -2
for d in 0 4096; do
  for kv in fp16 fp32; do
    $BIN/posttrainllm bench /tmp/l1b.gguf --device cuda --kv-quantize $kv -p 0 -n 128 -r 3 -d $d --json 2>&1 | tr -d '\n' | tee -a "$OUT/bench_1b.jsonl"; echo | tee -a "$OUT/bench_1b.jsonl"
  done
done
echo "== anchors"
python3 scripts/cuda_anchor.py 128 2>&1 | grep -v Warning | tee "$OUT/anchor.jsonl"
