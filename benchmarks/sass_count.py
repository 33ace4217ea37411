"""Instructions per weight of the decode GEMVs, read from their SASS: no GPU needed.

    python benchmarks/sass_count.py [--shape qkv] [--prologue 1]

Each kernel is compiled for sm_90 (H100 / H200) by Triton with its bundled ``ptxas`` (pointer
arguments marked 16-byte aligned, as Triton's launcher specializes them) and disassembled with
its bundled ``cuobjdump``. The dynamic count per thread is the straight-line code plus the K
loop's body times its extra iterations; divided by the weights a thread reads, it is the
instruction cost per weight (the GEMVs of a decode step at batch 1 are bound by memory only while
this stays low enough: an H200 issues about 3.3e13 thread instructions per second, and 4.2 TB/s
of int4 weights is 8.4e12 weights per second). Prints one row per kernel and tile with the
opcodes of the loop body.

The counts are static facts of the code; whether a kernel is then bound by memory, issue or
latency is for ``benchmarks/gpu_decode.py sweep`` to measure on the device.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passctl_path import ensure_passctl_importable  # noqa: E402

ensure_passctl_importable()

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096),
          "down": (4096, 11008), "lm_head": (32000, 4096)}

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)[.\s]")


def sass_of(fn, signature: dict, constants: dict, num_warps: int) -> str:
    """The SASS text of ``fn`` compiled for sm_90 with ``constants`` (constexpr arguments)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = dict(signature, **{k: "constexpr" for k in constants})
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
             for k, v in signature.items() if v.startswith("*")}
    src = ASTSource(fn=fn, signature=sig, constexprs=constants, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps))
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory(prefix="passctl-sass-") as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", path],
                              capture_output=True, text=True, check=True).stdout


def dynamic_count(sass: str, iterations: int):
    """``(instructions per thread, loop body opcodes)``: straight-line code plus the first
    backward branch's body ``iterations - 1`` more times."""
    ins = [(int(a, 16), op) for a, op in _INSTR.findall(sass)]
    loop = None
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA\s.*?0x([0-9a-f]+)", line)
        if m and int(m.group(2), 16) < int(m.group(1), 16):
            loop = (int(m.group(2), 16), int(m.group(1), 16))
            break
    body = collections.Counter(op for a, op in ins if loop and loop[0] <= a <= loop[1])
    total = len(ins) + (iterations - 1) * sum(body.values())
    return total, body


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=tuple(SHAPES), default="qkv")
    p.add_argument("--prologue", type=int, choices=(0, 1, 2), default=1)
    args = p.parse_args(argv)
    from passctl.targets.tvm import triton_decode as K

    n, k = SHAPES[args.shape]
    common = dict(N=n, K=k, EPS=1e-5, PROLOGUE=args.prologue, HAS_RES=False, SPLIT_K=1,
                  PDL=False)
    ptrs = {"scale_ptr": "*fp32", "x_ptr": "*fp32", "norm_ptr": "*fp32", "res_ptr": "*fp32",
            "out_ptr": "*fp16"}
    cases = [  # kernel, weight pointer, bits, block_n, block_k, warps, extra constants
        ("gemv_kernel (rows)", K.gemv_kernel, "*u8", 8, 32, 256, 8, dict(GROUP=128)),
        ("gemv_kernel (rows)", K.gemv_kernel, "*u8", 4, 8, 512, 8, dict(GROUP=128)),
        ("gemv_planes_kernel", K.gemv_planes_kernel, "*i32", 8, 16, 1024, 4, dict(WG=32)),
        ("gemv_planes_kernel", K.gemv_planes_kernel, "*i32", 4, 16, 2048, 8, dict(WG=16)),
        ("gemv_half2_kernel", K.gemv_half2_kernel, "*i64", 8, 16, 2048, 2,
         dict(GROUP=128, EMULATE=False)),
        ("gemv_half2_kernel", K.gemv_half2_kernel, "*i64", 4, 16, 2048, 2,
         dict(GROUP=128, EMULATE=False)),
        ("gemv_half2_kernel", K.gemv_half2_kernel, "*i64", 4, 16, 4096, 4,
         dict(GROUP=128, EMULATE=False)),
    ]
    print(f"{args.shape} [{n}x{k}], prologue {args.prologue}, sm_90")
    print("| kernel | bits | BLOCK_N x BLOCK_K, warps | instructions / thread | weights / thread "
          "| instructions / weight | loop body (top opcodes) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, fn, wptr, bits, bn, bk, nw, extra in cases:
        sig = {"w_ptr": wptr, **ptrs}
        if fn is K.gemv_planes_kernel:
            sig["magic"] = "i32"
        consts = dict(common, WBITS=bits, BLOCK_N=bn, BLOCK_K=bk, **extra)
        sass = sass_of(fn, sig, consts, nw)
        iters = -(-k // bk)
        total, body = dynamic_count(sass, iters)
        per_thread = bn * k / (32 * nw)
        top = ", ".join(f"{op} {c}" for op, c in body.most_common(6))
        print(f"| {label} | {bits} | {bn} x {bk}, {nw} | {total} | {per_thread:.0f} | "
              f"{total / per_thread:.2f} | {top} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
