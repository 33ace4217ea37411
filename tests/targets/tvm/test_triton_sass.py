"""The decode GEMVs compiled for sm_90 with Triton's bundled ptxas, on the CPU: the inline PTX of
gemv_half2_kernel (which Triton's interpreter cannot run, see test_triton_decode.py) assembles,
lands in the machine code as f16x2 instructions, and spills nothing to local memory, for int8
and int4, every prologue, masked and unmasked tiles. benchmarks/sass_count.py reads the same
SASS for instruction counts."""

from __future__ import annotations

import os
import re
import sys

import pytest

pytest.importorskip("triton")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "benchmarks"))


def _opcodes(sass: str):
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)[.\s]", sass)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("prologue,n,k,block_k,warps", [
    (1, 12288, 4096, 2048, 2),    # qkv: unmasked tiles
    (2, 4096, 11008, 2048, 2),    # down: K tiles past K (masked)
    (0, 40, 384, 128, 1),         # rows not a multiple of the tile (masked)
])
def test_half2_gemv_ptx_assembles_into_f16x2_code_without_spills(bits, prologue, n, k, block_k,
                                                                 warps):
    from sass_count import sass_of

    from passctl.targets.tvm import triton_decode as K

    ptrs = {"w_ptr": "*i64", "scale_ptr": "*fp32", "x_ptr": "*fp32", "norm_ptr": "*fp32",
            "res_ptr": "*fp32", "out_ptr": "*fp16"}
    consts = dict(N=n, K=k, EPS=1e-5, WBITS=bits, GROUP=64 if k == 384 else 128,
                  PROLOGUE=prologue, HAS_RES=False, BLOCK_N=16, BLOCK_K=block_k, SPLIT_K=1,
                  PDL=False, EMULATE=False)
    sass = sass_of(K.gemv_half2_kernel, ptrs, consts, warps)
    ops = _opcodes(sass)
    assert ops, "no SASS"
    counts = {op: ops.count(op) for op in set(ops)}
    # the word arithmetic of _INT4_WORD_DOT / _INT8_WORD_DOT: the magic-number subtraction
    # (v - 1032 for int4's low nibbles, v - 1152 for int8) as f16x2 adds with both halves'
    # immediates, and f16x2 multiply-adds (the emulated path has neither immediate pair)
    magic = "-1032, -1032" if bits == 4 else "-1152, -1152"
    assert len(re.findall(r"HADD2 R\d+, R\d+, " + magic, sass)) >= 2, counts
    assert counts.get("HFMA2", 0) >= 4, counts
    assert counts.get("PRMT" if bits == 8 else "LOP3", 0) >= 4, counts
    assert "STL" not in counts and "LDL" not in counts, counts   # no register spills
