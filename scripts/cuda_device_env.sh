# Sourced by the device scripts (cuda_{attn,batch,decode,kivi,pdl,serve}_device.sh), run from a
# folder holding prebuilt/ (posttrainllm and the test binaries, or bin.tar.xz of them;
# lib.tar.gz: the .so files the device lacks): unpacks them, finds a cuBLAS for the GEMM
# path (loaded at run time: the toolkit's, else the one PyTorch's wheels bring) and sets
# B, CUB, PTLLM_CUBLAS and LD_LIBRARY_PATH; device_preamble for the scripts that run tests.
B=prebuilt
# (lib.tar.xz where the carried folder needs the smaller file.)
if [ ! -d $B/lib ]; then
  if [ -f $B/lib.tar.xz ]; then tar xJf $B/lib.tar.xz -C $B; else tar xzf $B/lib.tar.gz -C $B; fi
fi
# The binaries may travel packed too (bin.tar.xz: the carried folder is limited to 64 MiB).
[ -f $B/bin.tar.xz ] && [ ! -x $B/posttrainllm ] && tar xJf $B/bin.tar.xz -C $B
CUB=$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null | head -1)
SITES="$(python3 -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null) /usr/local/lib /opt"
for v in 13 12; do
  [ -n "$CUB" ] && break
  for d in $SITES; do CUB=$(find "$d" -name "libcublas.so.$v" 2>/dev/null | head -1); [ -n "$CUB" ] && break; done
done
[ -n "$CUB" ] && export PTLLM_CUBLAS=$CUB
export LD_LIBRARY_PATH=$PWD/$B/lib:${CUB:+$(dirname "$CUB"):}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# What every device script does first: the GPU into $OUT/gpu.txt, the lite shared folder where
# the test binaries were built to look for it, and whether the prebuilt binaries run here.
device_preamble() {
  nvidia-smi --query-gpu=name,memory.total,clocks.max.memory,driver_version --format=csv | tee "$OUT/gpu.txt"
  ln -sfn "$PWD/shared-lite" /tmp/ptllm-shared-lite
  echo "cuBLAS: ${CUB:-none found}"
  if ! $B/posttrainllm --help >/dev/null 2>&1; then
    echo "prebuilt binaries do not run here"; ldd $B/posttrainllm | grep "not found"; exit 1
  fi
}

# CPU against GPU through the CLI on the lite shared folder's stories260K, for the device
# scripts' test parts (one copy of each loop, used by all of them):
# sample_cpu_vs_gpu N SETTING...: greedy text of N tokens per cache setting (one argument
# each, e.g. "--kv-quantize int4 --kivi-group 8"): "identical", the first lines of the diff, or
# which side failed (a failed or empty run is never "identical").
sample_cpu_vs_gpu() {
  local n=$1 m=shared-lite/models/stories260K t q rc rg; shift
  t=$(mktemp -d)
  for q in "$@"; do
    $B/posttrainllm sample $m -p "Once upon a time" -n "$n" -t 0 $q > "$t/cpu.txt" 2>"$t/cpu.err"; rc=$?
    $B/posttrainllm sample $m -p "Once upon a time" -n "$n" -t 0 $q --device cuda > "$t/gpu.txt" 2>"$t/gpu.err"; rg=$?
    if [ $rc -ne 0 ] || [ $rg -ne 0 ] || [ ! -s "$t/cpu.txt" ]; then
      echo "[$q] FAILED (cpu rc $rc, cuda rc $rg): $(tail -1 "$t/cpu.err") $(tail -1 "$t/gpu.err")"
    elif cmp -s "$t/cpu.txt" "$t/gpu.txt"; then echo "[$q] sample text identical"
    else echo "[$q] differs:"; diff "$t/cpu.txt" "$t/gpu.txt" | head -6; fi
  done
  rm -rf "$t"
}
# ppl_cpu_vs_gpu K SETTING...: perplexity through the cache over shared-lite/text.txt (K windows
# of 256) per --kv-quantize setting, on the CPU and the GPU: both and their relative difference;
# the raw JSON lines go to $OUT/ppl.jsonl.
ppl_cpu_vs_gpu() {
  local k=$1 m=shared-lite/models/stories260K q dev r p line; shift
  for q in "$@"; do
    line="k=$k [$q]"
    for dev in cpu cuda; do
      r=$($B/posttrainllm perplexity $m shared-lite/text.txt -w 256 -k "$k" --cache-only -q --json --device $dev \
          --kv-quantize $q 2>&1 | tr -d '\n')
      echo "$dev k=$k [$q] $r" >> "$OUT/ppl.jsonl"
      p=$(echo "$r" | python3 -c "import json,sys; print(repr(json.load(sys.stdin)['results'][0]['through_cache']['ppl']))" 2>/dev/null || echo nan)
      line="$line $dev $p"
    done
    echo "$line" | python3 -c "
import sys; w = sys.stdin.read().split(); c, g = float(w[-3]), float(w[-1])
print(' '.join(w), ' rel diff %.4f%%' % (abs(g - c) / c * 100))" 2>/dev/null || echo "$line"
  done
}

# filter: a gtest log without its RUN and trace lines. show NAME: one `bench --json` line on
# stdin as a summary line (tok/s, ms per step, read GB/s); anything else passes through cut.
# (cuda_batch_device.sh defines its own show, with the per-sequence bytes.)
filter() { grep -v "^\[ RUN\|Google Test trace"; }
show() {
  python3 -c "
import json,sys
j=json.loads(sys.stdin.read()); d=j['decode']
print('%-44s tok/s %8.1f +- %6.1f  ms/step %7.3f  read %.0f GB/s' % ('$1', d['tps_mean'], d['tps_sd'], d.get('ms_per_step', 1000/d['tps_mean']), d['achieved_read_gb_per_s']))" 2>/dev/null || cut -c1-400
}
