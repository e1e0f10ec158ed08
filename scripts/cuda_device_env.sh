# Sourced by the device scripts (cuda_batch_device.sh, cuda_serve_device.sh), run from a
# folder holding prebuilt/ (posttrainllm and the test binaries, or bin.tar.xz of them;
# lib.tar.gz: the .so files the device lacks): unpacks them, finds a cuBLAS for the GEMM
# path (loaded at run time: the toolkit's, else the one PyTorch's wheels bring) and sets
# B, CUB, PTLLM_CUBLAS and LD_LIBRARY_PATH; device_preamble for the scripts that run tests.
B=prebuilt
[ -d $B/lib ] || tar xzf $B/lib.tar.gz -C $B
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
