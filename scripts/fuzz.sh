#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, build dir build-fuzz) and
# runs TARGET (or all of them, one after another) for SECONDS each.
#
#   scripts/fuzz.sh all 300          # every target, 5 minutes each
#   scripts/fuzz.sh fuzz_safetensors 60
#   scripts/fuzz.sh list             # target names
#
# Seeds come from tests/fuzz/corpus/<dir>/ (read only); inputs libFuzzer finds
# interesting go to build-fuzz/corpus/<target>/, crashes/leaks/timeouts to
# build-fuzz/artifacts/<target>-*. Exit status is non-zero on the first
# finding (the reproducer path is printed). Per-target limits: 10 s per input,
# 2 GiB RSS. Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS
# (ninja -j, default 2), FUZZ_NO_BUILD=1 to skip the build, PTLLM_SHARED_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-}
SECONDS_EACH=${2:-60}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}

# target:corpus folder
ALL=(fuzz_safetensors:safetensors fuzz_safetensors_index:safetensors_index fuzz_gguf:gguf fuzz_gguf_model:gguf_model fuzz_hf_config:hf_config
     fuzz_tinygpt_config:tinygpt_config fuzz_tinygpt_file:tinygpt_file fuzz_tokenizer_json:tokenizer_json
     fuzz_prompt_llama2:prompt fuzz_prompt_bytelevel:prompt)

if [ -z "$TARGET" ] || [ "$TARGET" = "-h" ] || [ "$TARGET" = "--help" ]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
if [ "$TARGET" = list ]; then
  for t in "${ALL[@]}"; do echo "${t%%:*}"; done
  exit 0
fi
case "$SECONDS_EACH" in '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a positive integer, got '$SECONDS_EACH'" >&2; exit 2 ;; esac

SELECTED=()
for t in "${ALL[@]}"; do
  if [ "$TARGET" = all ] || [ "$TARGET" = "${t%%:*}" ]; then SELECTED+=("$t"); fi
done
if [ ${#SELECTED[@]} -eq 0 ]; then
  echo "fuzz.sh: unknown target '$TARGET' (one of: all $(for t in "${ALL[@]}"; do printf '%s ' "${t%%:*}"; done))" >&2
  exit 2
fi

if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  CXX_CLANG=$(command -v clang++ || command -v clang++-14 || true)
  C_CLANG=$(command -v clang || command -v clang-14 || true)
  if [ -z "$CXX_CLANG" ]; then echo "fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; fi
  if [ ! -f "$BUILD/build.ninja" ]; then
    extra=()
    [ -n "${PTLLM_SHARED_DIR:-}" ] && extra+=("-DPTLLM_SHARED_DIR=$PTLLM_SHARED_DIR")
    CC="$C_CLANG" CXX="$CXX_CLANG" cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DPTLLM_FUZZ=ON -DPTLLM_CUDA=OFF -DPTLLM_BUILD_TESTS=OFF -DPTLLM_BUILD_BENCH=OFF "${extra[@]}" >/dev/null
  fi
  names=()
  for t in "${SELECTED[@]}"; do names+=("${t%%:*}"); done
  ninja -C "$BUILD" -j "${FUZZ_JOBS:-2}" "${names[@]}"
fi

mkdir -p "$BUILD/artifacts"
status=0
summary=()
for t in "${SELECTED[@]}"; do
  name=${t%%:*}
  # tests/fuzz/CMakeLists.txt compiles src/ops for AVX-512 in this build
  # (clang cannot build its GCC-only dispatch); binaries that link it need the CPU.
  if [ "$name" = fuzz_tinygpt_config ] || [ "$name" = fuzz_tinygpt_file ] || [ "$name" = fuzz_gguf_model ]; then
    if ! grep -qw avx512f /proc/cpuinfo; then
      echo "$name: skipped (this fuzz build needs an AVX-512 CPU for src/ops)"; summary+=("$name: skipped (no AVX-512)"); continue
    fi
  fi
  seeds=tests/fuzz/corpus/${t#*:}
  work=$BUILD/corpus/$name
  mkdir -p "$work"
  log=$BUILD/artifacts/$name.log
  echo "== $name: ${SECONDS_EACH}s (seeds $seeds, log $log)"
  t0=$(date +%s)
  set +e
  # One process, one input at a time: the machine's cores are shared.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  OMP_NUM_THREADS=1 \
    "$BUILD/tests/fuzz/$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$name-" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - t0))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  line="$name: ${runs:-?} runs in ${took}s, ${speed:-?} exec/s, ${cov:-cov: ?}"
  if [ $rc -ne 0 ]; then
    line="$line  FINDING (exit $rc)"
    status=1
    tail -n 40 "$log" >&2
    ls "$BUILD/artifacts/$name-"* 2>/dev/null | grep -v '\.log$' >&2 || true
  fi
  echo "$line"
  summary+=("$line")
done
echo "== summary"
printf '%s\n' "${summary[@]}"
exit $status
