#!/usr/bin/env bash
# Registers and stack frame per GEMV kernel of src/cuda/kernels.cu as ptxas reports them
# (no GPU needed): recompiles kernels.cu with the build's own nvcc command plus -Xptxas -v
# into a temporary object. Usage: scripts/cuda_ptxas_usage.sh [BUILD_DIR] [NAME_FILTER]
# (default build, gemv). Needs a CUDA-enabled build folder (-DPTLLM_CUDA=ON).
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd); FILTER=${2:-gemv}
cmd=$(cd "$BUILD" && ninja -t commands src/cuda/all | grep -- "kernels.cu.o" | grep -v kivi | tail -1)
[ -n "$cmd" ] || { echo "no nvcc command for kernels.cu in $BUILD (not a CUDA build?)" >&2; exit 1; }
obj=$(mktemp --suffix=.o)
trap 'rm -f "$obj"' EXIT
(cd "$BUILD" && eval "${cmd/-o src\/cuda\/CMakeFiles\/ptllm_cuda.dir\/kernels.cu.o/-o $obj} -Xptxas -v") 2>&1 |
  python3 -c '
import re, subprocess, sys
filt = sys.argv[1]
fn, stack = None, "?"
for line in sys.stdin:
    m = re.search(r"Compiling entry function .(_Z\w+).", line)
    if m: fn, stack = m.group(1), "?"
    m = re.search(r"(\d+) bytes stack frame", line)
    if m: stack = m.group(1)
    m = re.search(r"Used (\d+) registers", line)
    if m and fn and filt in fn:
        name = subprocess.run(["c++filt", fn], capture_output=True, text=True).stdout.strip()
        name = re.sub(r"ptllm::cuda::k::\(anonymous namespace\)::", "", name).split("(")[0]
        print("%4s registers  %3s B stack  %s" % (m.group(1), stack, name))
        fn = None
' "$FILTER"
