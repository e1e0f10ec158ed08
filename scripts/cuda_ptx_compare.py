#!/usr/bin/env python3
"""Compare two PTX files of the same .cu source kernel by kernel, without a GPU.

Each kernel's instructions are counted with register numbers and labels blanked (and
`setp.gt` written as `setp.lt`, which the compiler may emit for the same comparison with its
operands swapped), so a change that only moves code into inline helpers shows as equal
multisets. Used in session 31 (docs/CUDA.md) for the KIVI kernels' refactor:
  git show REV:src/cuda/kivi_kernels.cu > /tmp/kivi_orig.cu
  nvcc -DPTLLM_HAVE_CUDA=1 -Isrc -O3 -DNDEBUG -arch=sm_90a -std=c++17 -ptx -o before.ptx /tmp/kivi_orig.cu
  nvcc ... -ptx -o after.ptx src/cuda/kivi_kernels.cu
  scripts/cuda_ptx_compare.py before.ptx after.ptx
Equal multisets are evidence, not proof (operands swapped between two like instructions would
not show); the GPU tests are the proof.
"""
import collections
import re
import sys


def kernels(path):
    # The anonymous namespace's mangled name carries a hash of the file name: blank it.
    text = re.sub(r'k\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+', 'kG', open(path).read())
    text = re.sub(r'_ZZN\d+_INTERNAL_[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+', 'INT', text)
    parts = re.split(r'(?m)^\.entry ', text)
    return {p.split('(')[0]: p for p in parts[1:]}


def bag(body):
    counts = collections.Counter()
    for line in body.split('\n'):
        line = line.strip()
        if not line or line.startswith(('.reg', '//', '$L')):
            continue
        line = re.sub(r'%(rd|rs|r|fd|f|p)\d+', lambda m: '%' + m.group(1), line)
        line = re.sub(r'\$L__BB\d+_\d+', '$L', line)
        counts[line.replace('setp.gt.', 'setp.lt.')] += 1
    return counts


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: cuda_ptx_compare.py BEFORE.ptx AFTER.ptx')
    a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
    if set(a) != set(b):
        print('kernels only before:', sorted(set(a) - set(b))[:5])
        print('kernels only after:', sorted(set(b) - set(a))[:5])
    differ = 0
    for name in sorted(set(a) & set(b)):
        ba, bb = bag(a[name]), bag(b[name])
        if ba != bb:
            differ += 1
            print(name[:120])
            print('  only before:', dict(ba - bb))
            print('  only after: ', dict(bb - ba))
    print(f'{len(set(a) & set(b))} kernels in both, {differ} with a different instruction multiset')
    sys.exit(1 if differ or set(a) != set(b) else 0)


if __name__ == '__main__':
    main()
