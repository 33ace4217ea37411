#!/usr/bin/env bash
# The H200 measurements behind docs/tvm.md's GPU table (issue 5), in one call on the lent GPU
# machine (after the two-call TVM install of ../shared/GPU.md; the machine allows 600 s per command):
#   1. BERT-base b8 s128 fp32: torch, TVM's default pipeline, passctl `cleanup,fuse` and
#      `cleanup,fuse,flash-attn` -> TVM, with each TVM build's kernel-time profile;
#   2. BERT-base b8 s512 fp16: torch eager / sdpa and the two passctl builds;
#   3. the Triton numerics check (benchmarks/gpu_triton_check.py).
# Usage on the GPU machine, from the repository root:
#   bash .gpu/b/install.sh && export PYTHONPATH=/tmp/tvmsite:$PWD && bash benchmarks/gpu_bert.sh
# Output goes to stdout and, when $OUT is set (the device tool's output folder), to $OUT/*.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp}"
python3 benchmarks/gpu_tvm.py --configs 128:fp32 --kernel-profile --budget-s 290 \
    --variants '^(torch|tvm default|passctl -> tvm$|passctl \+flash-attn -> tvm$)' 2>&1 | tee "$out/gpu_tvm_fp32.txt"
python3 benchmarks/gpu_tvm.py --configs 512:fp16 --budget-s 170 \
    --variants '^(torch|passctl -> tvm$|passctl \+flash-attn -> tvm$)' 2>&1 | tee "$out/gpu_tvm_fp16.txt"
timeout 100 python3 benchmarks/gpu_triton_check.py 2>&1 | tee "$out/gpu_triton_check.txt"
