"""Triton dispatch of TVM CUDA builds, no GPU: PTX per compute capability, Relax rewrite, build."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from passctl.ir import from_onnx
from passctl.targets import get_target
from passctl.targets.tvm.build import compile_module
from passctl.targets.tvm.frontend import to_relax
from passctl.targets.tvm.support import tvm_target
from passctl.targets.tvm.triton_dispatch import (AttentionSpec, GemmSpec, TritonLibrary,
                                                 attention_kernel_for, dispatch_gemms,
                                                 gemm_kernel_for)

REPO = Path(__file__).resolve().parents[3]


def _check_script():
    """benchmarks/gpu_triton_check.py (its graph builders and numpy references)."""
    spec = importlib.util.spec_from_file_location("gpu_triton_check_for_tests",
                                                  REPO / "benchmarks" / "gpu_triton_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def h200():
    return tvm_target(get_target("h200"))


# -- TritonLibrary ---------------------------------------------------------------------------

def _entry(ptx: str, name: str) -> str:
    match = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    assert match is not None, f"no .entry {name} in the PTX"
    return match.group(1)


def test_ptx_entries_renamed_per_specialization_and_cached():
    lib = TritonLibrary((9, 0), 132)
    k1, grid1 = gemm_kernel_for(lib, GemmSpec(1, 64, 64, 32, "float16", bias=True))
    k2, grid2 = gemm_kernel_for(lib, GemmSpec(1, 64, 64, 32, "float16", act=3))
    assert k1.name != k2.name
    for k in (k1, k2):
        assert ".target sm_90" in k.ptx
        assert re.search(r"\.visible\s+\.entry\s+" + k.name + r"\(", k.ptx)
        assert not re.search(r"\bgemm_kernel\b", k.ptx)  # Triton's own entry name is gone
        params = _entry(k.ptx, k.name).count(".param")
        assert k.pointer_params == ("a_ptr", "b_ptr", "bias_ptr", "res_ptr", "c_ptr")
        assert k.hidden == params - 5 and k.hidden >= 0
        assert k.threads == k.config["num_warps"] * 32
        assert f".reqntid {k.threads}" in k.ptx
    # the other specialization's entry is not in this PTX (each kernel is its own CUDA module)
    assert k2.name not in k1.ptx
    # 64 x 64 fills no SM count: the last fp16 candidate (64 x 64 x 64), one block
    assert (k1.config["BLOCK_M"], k1.config["BLOCK_N"], k1.config["BLOCK_K"]) == (64, 64, 64)
    assert grid1 == grid2 == (1, 1, 1)
    again, _ = gemm_kernel_for(lib, GemmSpec(1, 64, 64, 32, "float16", bias=True))
    assert again is k1
    assert [e["kernel"] for e in lib.log] == [k1.name, k2.name]
    assert [e["what"] for e in lib.log] == ["gemm 64x32x64 float16 +bias", "gemm 64x32x64 float16 relu"]


def test_tile_choice_fills_the_sms_and_compute_capability_is_the_target():
    lib = TritonLibrary((8, 0), 108)
    kernel, grid = gemm_kernel_for(lib, GemmSpec(1, 1024, 1024, 64, "float32"))
    # fp32 ieee candidates in order: 128x128 tiles give 64 blocks (< 108 SMs), 128x64 gives 128
    assert (kernel.config["BLOCK_M"], kernel.config["BLOCK_N"]) == (128, 64)
    assert grid == (8 * 16, 1, 1)
    assert ".target sm_80" in kernel.ptx
    attn, agrid = attention_kernel_for(lib, AttentionSpec(2, 4, 2, 100, 100, 80, 80, "float16",
                                                          0.1, causal=True))
    # D 80 > 64: candidates (128, 64), (64, 64), (128, 32); 1 x 8 and 2 x 8 blocks fill nothing
    assert (attn.config["BLOCK_M"], attn.config["BLOCK_N"]) == (128, 32)
    assert agrid == (1, 8, 1)
    assert attn.pointer_params == ("q_ptr", "k_ptr", "v_ptr", "mask_ptr", "o_ptr")
    assert lib.log[-1]["what"] == "attention B2 H4/2 S100 T100 D80 float16 causal"


def test_each_specialization_is_tuned_once_per_library(monkeypatch):
    """Repeated layers (BERT's 12 identical FFN GEMMs) share one tile choice: the candidates are
    timed once per spec, not once per call (each timing picked its own tile, by noise)."""
    picks = []
    pick = TritonLibrary._pick

    def counting_pick(self, candidates, grid_of, bench):
        picks.append(len(candidates))
        return pick(self, candidates, grid_of, None)  # no GPU here: the heuristic choice

    monkeypatch.setattr(TritonLibrary, "_pick", counting_pick)
    lib = TritonLibrary((9, 0), 132, tune=True)
    spec = GemmSpec(1, 256, 128, 64, "float32", bias=True)
    first = gemm_kernel_for(lib, spec)
    assert gemm_kernel_for(lib, spec) is first and gemm_kernel_for(lib, GemmSpec(
        1, 256, 128, 64, "float32", bias=True)) is first
    assert len(picks) == 1
    gemm_kernel_for(lib, GemmSpec(1, 256, 128, 64, "float32"))  # no bias: another kernel
    attn = AttentionSpec(1, 2, 2, 64, 64, 64, 64, "float16", 0.125)
    assert attention_kernel_for(lib, attn) is attention_kernel_for(lib, attn)
    assert len(picks) == 3 and len(lib.log) == 3


def test_library_rejects_unknown_fp32_precision():
    from passctl.ir.errors import UserError

    with pytest.raises(UserError, match=r"'fp16'.*'ieee', 'tf32' or 'tf32x3'"):
        TritonLibrary((9, 0), 132, fp32_precision="fp16")


# -- dispatch_gemms --------------------------------------------------------------------------

def _gemm_model(kind: str, dtype: str = "float32"):
    """x [2, 8, 24] @ W [24, 32] (+ epilogue by ``kind``) as ONNX."""
    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    rng = np.random.default_rng(0)
    w_shape = (32, 24) if kind.startswith("transposed") else (24, 32)
    inits = {"w": rng.standard_normal(w_shape), "b": rng.standard_normal(32),
             "w2": rng.standard_normal((32, 24)), "b2": rng.standard_normal(24)}
    mm = helper.make_node("MatMul", ["x", "w"], ["m"])
    inputs, outputs = [("x", [2, 8, 24])], [("y", [2, 8, 32])]
    nodes = {
        "bias": [mm, helper.make_node("Add", ["m", "b"], ["y"])],
        "bias_gelu": [mm, helper.make_node("Add", ["m", "b"], ["h"]),
                      helper.make_node("Gelu", ["h"], ["y"])],
        "bias_gelu_tanh": [mm, helper.make_node("Add", ["m", "b"], ["h"]),
                           helper.make_node("Gelu", ["h"], ["y"], approximate="tanh")],
        "bias_relu_residual": [mm, helper.make_node("Add", ["m", "b"], ["h"]),
                               helper.make_node("Relu", ["h"], ["g"]),
                               helper.make_node("Add", ["g", "r"], ["y"])],
        "residual_then_bias": [mm, helper.make_node("Add", ["m", "r"], ["h"]),
                               helper.make_node("Add", ["h", "b"], ["y"])],
        "bias_first": [mm, helper.make_node("Add", ["b", "m"], ["y"])],
        "transposed": [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                       helper.make_node("MatMul", ["x", "wt"], ["m"]),
                       helper.make_node("Add", ["m", "b"], ["y"])],
        "transposed_no_perm": [helper.make_node("Transpose", ["w"], ["wt"]),  # axes reversed
                               helper.make_node("MatMul", ["x", "wt"], ["m"]),
                               helper.make_node("Add", ["m", "b"], ["y"])],
        "two_consumers": [mm, helper.make_node("Add", ["m", "b"], ["y"]),
                          helper.make_node("Relu", ["m"], ["z"])],
        "relu_without_bias": [mm, helper.make_node("Relu", ["m"], ["y"])],
        "mlp": [mm, helper.make_node("Add", ["m", "b"], ["h"]), helper.make_node("Gelu", ["h"], ["g"]),
                helper.make_node("MatMul", ["g", "w2"], ["m2"]),
                helper.make_node("Add", ["b2", "m2"], ["h2"]),
                helper.make_node("Add", ["h2", "x"], ["y"])],
        "matmul_4d": [helper.make_node("MatMul", ["x", "k"], ["y"])],
    }[kind]
    if kind in ("bias_relu_residual", "residual_then_bias"):
        inputs.append(("r", [2, 8, 32]))
    if kind == "two_consumers":
        outputs.append(("z", [2, 8, 32]))
    if kind == "mlp":
        outputs = [("y", [2, 8, 24])]
    if kind == "matmul_4d":
        inputs, outputs = [("x", [2, 2, 8, 24]), ("k", [2, 2, 24, 32])], [("y", [2, 2, 8, 32])]
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes, kind, [helper.make_tensor_value_info(n, tp, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, tp, s) for n, s in outputs],
        [numpy_helper.from_array(v.astype(dtype), k) for k, v in inits.items() if k in used])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


# kind -> (labels of the dispatched GEMMs, kernel pointer args a, b, bias, res, c per launcher)
GEMM_CASES = {
    "bias": (["gemm 16x24x32 float32 +bias"], [[0, 1, 2, 3, 3]]),
    "bias_gelu": (["gemm 16x24x32 float32 +bias gelu"], [[0, 1, 2, 3, 3]]),
    "bias_gelu_tanh": (["gemm 16x24x32 float32 +bias gelu_tanh"], [[0, 1, 2, 3, 3]]),
    "bias_relu_residual": (["gemm 16x24x32 float32 +bias relu +residual"], [[0, 1, 2, 3, 4]]),
    "residual_then_bias": (["gemm 16x24x32 float32 +bias +residual"], [[0, 1, 2, 3, 4]]),
    "bias_first": (["gemm 16x24x32 float32 +bias"], [[0, 1, 2, 3, 3]]),
    "transposed": (["gemm 16x24x32 float32 B^T +bias"], [[0, 1, 2, 3, 3]]),
    "transposed_no_perm": (["gemm 16x24x32 float32 B^T +bias"], [[0, 1, 2, 3, 3]]),
    "two_consumers": (["gemm 16x24x32 float32"], [[0, 1, 2, 2, 2]]),
    "relu_without_bias": (["gemm 16x24x32 float32"], [[0, 1, 2, 2, 2]]),
    "mlp": (["gemm 16x24x32 float32 +bias gelu", "gemm 16x32x24 float32 +bias +residual"],
            [[0, 1, 2, 3, 3], [0, 1, 2, 3, 4]]),
    "matmul_4d": ([], []),
}


def _launcher_args(mod, name: str):
    """The ``T.call_packed`` arguments of ``name``_launch, as text."""
    text = mod[name + "_launch"].script()
    call = re.search(r"T\.call_packed\((.*)\)", text).group(1)
    return [a.strip() for a in call.split(",")], text


@pytest.mark.parametrize("kind", sorted(GEMM_CASES))
def test_dispatch_gemms_takes_the_epilogue(kind, h200):
    labels, pointers = GEMM_CASES[kind]
    lib = TritonLibrary((9, 0), 132)
    mod, _ = to_relax(from_onnx(_gemm_model(kind)), kind, kernels=lib)
    mod, count = dispatch_gemms(mod, lib)
    assert count == len(labels)
    assert [e["what"] for e in lib.log] == labels
    main = mod["main"].script()
    assert main.count("R.call_tir(passctl_gemm_kernel_") == len(labels)
    assert ("R.matmul" in main) == (kind == "matmul_4d")
    assert "R.permute_dims" not in main  # the transposed weight is read in place
    if kind == "two_consumers":  # the matmul's result is used twice: its epilogue stays in Relax
        assert "R.add(" in main and "R.nn.relu(" in main
    elif kind == "relu_without_bias":  # an activation is taken only after a bias
        assert "R.nn.relu(" in main
    else:
        assert "R.add(" not in main and "R.nn." not in main
    for entry, ptrs in zip(lib.log, pointers):
        kernel = next(k for k in lib.kernels.values() if k.name == entry["kernel"])
        args, _ = _launcher_args(mod, kernel.name)
        assert args[0] == f'"{kernel.name}"'
        assert args[1:6] == [f"B{i}.data" for i in ptrs]
        assert args[6:6 + kernel.hidden] == ["T.int64(0)"] * kernel.hidden
        assert int(args[6 + kernel.hidden]) == kernel.threads
    if not labels:
        return
    executable, _ = compile_module(mod, h200, tensorize=False, cuda_graph=True)
    host = executable.mod.imports[0]
    assert host.kind == "llvm"
    source = host.inspect_source("ll")
    vm_text = executable.as_text()
    for entry in lib.log:
        # the host code looks the kernel up by name (call_packed) and the VM calls its launcher
        assert f'c"{entry["kernel"]}\\00"' in source
        assert f"call  {entry['kernel']}_launch in:" in vm_text


def test_dispatch_gemms_float16_epilogue(h200):
    lib = TritonLibrary((9, 0), 132)
    mod, _ = to_relax(from_onnx(_gemm_model("bias_relu_residual", "float16")), "g", kernels=lib)
    mod, count = dispatch_gemms(mod, lib)
    assert count == 1 and [e["what"] for e in lib.log] == ["gemm 16x24x32 float16 +bias relu +residual"]
    args, text = _launcher_args(mod, lib.log[0]["kernel"])
    assert 'B2: T.Buffer((32,), "float16")' in text and 'B4: T.Buffer((2, 8, 32), "float16")' in text
    if lib.log[0]["shared_bytes"]:  # dynamic shared memory is the launch's last argument
        assert int(args[-1]) == lib.log[0]["shared_bytes"]


# -- attention ---------------------------------------------------------------------------------

def test_attention_runs_the_triton_kernel(h200):
    g = _check_script()
    cases = [
        (g.attention_graph("float16", "none", True, h=4, hkv=2, s=40, t=56, d=80),
         "attention B2 H4/2 S40 T56 D80 float16 causal", 3),
        (g.attention_graph("float32", "additive", False, h=2, hkv=2, s=24, t=24, d=32),
         "attention B2 H2/2 S24 T24 D32 float32 +mask", 4),
        (g.attention_graph("float16", "boolean", False, h=2, hkv=2, s=24, t=24, d=32),
         "attention B2 H2/2 S24 T24 D32 float16 +mask", 4),
        (g.bshd_attention_graph("float32", s=24, h=2, d=32),
         "attention B2 H2/2 S24 T24 D32 float32 causal BSHD in", 3),
    ]
    for (model, _, _), label, n_inputs in cases:
        lib = TritonLibrary((9, 0), 132)
        mod, _ = to_relax(from_onnx(model), "g", kernels=lib)
        assert [e["what"] for e in lib.log] == [label]
        main = mod["main"].script()
        assert "R.permute_dims" not in main and "R.nn.attention" not in main
        name = lib.log[0]["kernel"]
        args, _ = _launcher_args(mod, name)
        out = n_inputs  # the output buffer follows the inputs; an absent mask points at it
        assert args[1:6] == ["B0.data", "B1.data", "B2.data", f"B{3 if n_inputs == 4 else out}.data",
                             f"B{out}.data"]
        executable, _ = compile_module(mod, h200, tensorize=False, cuda_graph=True)
        assert f'c"{name}\\00"' in executable.mod.imports[0].inspect_source("ll")


def test_attention_mask_broadcast_over_keys_falls_back(h200):
    # a [B, 1, S, 1] mask has no key axis to read with unit stride: TVM's kernels take it (fp16:
    # the decomposed softmax; TVM's fp32 nn.attention rejects a bias broadcast over keys)
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT16, [1, 2, 8, 16])
    m = helper.make_tensor_value_info("m", TensorProto.FLOAT16, [1, 1, 8, 1])
    node = helper.make_node("Attention", ["q", "q", "q", "m"], ["y"], domain="passctl", scale=0.25,
                            mask_kind="additive", is_causal=0, num_heads=2, kv_num_heads=2,
                            softmax_precision=1, nan_to_zero=0)
    graph = helper.make_graph([node], "g", [q, m],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 2, 8, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("passctl", 1)])
    lib = TritonLibrary((9, 0), 132)
    mod, _ = to_relax(from_onnx(model), "g", kernels=lib)
    main = mod["main"].script()
    assert lib.log == [] and "R.nn.softmax" in main and "R.call_tir" not in main


# -- shared memory per block -------------------------------------------------------------------

def test_every_gpu_profile_has_a_shared_memory_limit():
    from passctl.targets import list_targets
    from passctl.targets.tvm.triton_dispatch import MAX_SHARED_BYTES

    for profile in list_targets():
        if profile.is_gpu:
            assert profile.compute_capability in MAX_SHARED_BYTES, profile.name
    assert MAX_SHARED_BYTES[(7, 5)] == 65536 and MAX_SHARED_BYTES[(9, 0)] == 232448


def test_config_steps_down_to_fit_shared_memory():
    spec = GemmSpec(1, 64, 64, 256, "float16", bias=True)
    roomy = TritonLibrary((9, 0), 132)
    big, _ = gemm_kernel_for(roomy, spec)
    assert big.shared > 0
    tight = TritonLibrary((9, 0), 132)
    tight.max_shared = big.shared - 1  # a device with a little less shared memory per block
    small, grid = gemm_kernel_for(tight, spec)
    assert 0 < small.shared <= tight.max_shared
    assert (small.config["num_stages"], small.config["BLOCK_N"]) != (big.config["num_stages"],
                                                                    big.config["BLOCK_N"])
    assert grid == (1, 1, 1) and len(tight.log) == 1 and tight.log[0]["shared_bytes"] == small.shared


def test_nothing_fits_shared_memory_falls_back_to_tvm_kernels(h200, monkeypatch):
    from passctl.targets.tvm import triton_specs

    monkeypatch.setattr(triton_specs, "_gemm_candidates", lambda dtype, precision: [
        {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}])
    monkeypatch.setattr(triton_specs, "_attention_candidates", lambda d, precision: [
        {"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}])
    lib = TritonLibrary((9, 0), 132)
    lib.max_shared = -1  # no kernel fits
    with pytest.raises(ValueError, match=r"no tile configuration fits the -1 bytes .* sm_90"):
        gemm_kernel_for(lib, GemmSpec(1, 64, 64, 32, "float32"))
    mod, _ = to_relax(from_onnx(_gemm_model("bias_gelu")), "g", kernels=lib)
    mod, count = dispatch_gemms(mod, lib)
    main = mod["main"].script()
    assert count == 0 and "R.matmul(" in main and "R.nn.gelu(" in main and "R.call_tir" not in main
    model, _, _ = _check_script().attention_graph("float32", "additive", False, h=2, hkv=2, s=24,
                                                  t=24, d=32)
    mod, _ = to_relax(from_onnx(model), "g", kernels=lib)
    assert "R.nn.attention_bias(" in mod["main"].script()  # TVM's nn.attention with a mask
    assert lib.log == [] and lib.kernels == {}
