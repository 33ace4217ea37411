#!/usr/bin/env bash
# The GPU measurements issue 5 still needs, in the order they matter, for one call on the lent H200
# (after the two-call TVM install of ../shared/GPU.md; the machine allows 600 s per command):
#   1. BERT-base b8 s128 fp32: TVM's default pipeline vs passctl -> TVM with fp32_precision ieee and
#      tf32x3 (3xTF32, fp32-level error) -- the missing ">= 2x TVM's default" goal;
#   2. the Triton numerics check (GPU code paths changed after its last GPU run), if time is left.
# Usage on the GPU machine, from the repository root:
#   bash .gpu/b/install.sh && export PYTHONPATH=/tmp/tvmsite:$PWD && bash benchmarks/gpu_pending.sh
# Output goes to stdout and, when $OUT is set (the device tool's output folder), to $OUT/*.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp}"
python3 benchmarks/gpu_tvm.py --configs 128:fp32 --variants "cleaned|^passctl -> tvm" \
    --budget-s 330 2>&1 | tee "$out/gpu_tvm_fp32.txt"
python3 benchmarks/gpu_triton_check.py 2>&1 | tee "$out/gpu_triton_check.txt"
