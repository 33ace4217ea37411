"""Triton GEMM and FlashAttention kernels (targets/tvm/triton_kernels.py) on the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from triton_interp_cases import ATTENTION_CASES, CASES, GEMM_CASES

SCRIPT = Path(__file__).resolve().parent / "triton_interp_cases.py"


@pytest.fixture(scope="module")
def interp_results():
    """Every case run once in a child process with TRITON_INTERPRET=1 (Triton chooses the
    interpreter when ``@triton.jit`` decorates, so this process's kernels stay compiled ones)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(SCRIPT.parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_cases_ran_on_the_interpreter(interp_results):
    assert interp_results["interpreted"] is True
    assert set(interp_results["cases"]) == set(CASES)


def test_this_process_kernels_are_not_interpreted():
    # the child's TRITON_INTERPRET must not leak into this worker's (compiling) kernels
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from passctl.targets.tvm.triton_kernels import gemm_kernel

    assert isinstance(gemm_kernel, JITFunction)
    assert not isinstance(gemm_kernel, InterpretedFunction)


@pytest.mark.parametrize("case", sorted(GEMM_CASES))
def test_gemm_matches_numpy(interp_results, case):
    r = interp_results["cases"][case]
    assert r["rel"] <= GEMM_CASES[case], r
    assert r["nan_rows"] == 0 and r["nan_match"]


@pytest.mark.parametrize("case", sorted(set(ATTENTION_CASES) - {"attn_fully_masked_row_nan",
                                                                 "attn_nan_to_zero"}))
def test_attention_matches_numpy(interp_results, case):
    r = interp_results["cases"][case]
    assert r["rel"] <= ATTENTION_CASES[case], r
    assert r["nan_rows"] == 0 and r["nan_match"]


def test_attention_fully_masked_row_is_nan(interp_results):
    # query 3 sees no key (boolean mask row all False) in each of the 2 x 2 (batch, head) pairs:
    # NaN like the decomposed softmax (numpy's reference gives NaN there too), the rest exact
    r = interp_results["cases"]["attn_fully_masked_row_nan"]
    assert r["nan_match"] and r["nan_rows"] == 4, r
    assert r["rel"] <= 1e-5


def test_attention_nan_to_zero_gives_zero_rows(interp_results):
    r = interp_results["cases"]["attn_nan_to_zero"]
    assert r["nan_rows"] == 0 and r["zero_rows"] == 4 and r["nan_match"], r
    assert r["rel"] <= 1e-5
