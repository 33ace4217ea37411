"""TVM CUDA builds around the Triton kernels: weight packing, kernel options, fallback, SMs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm_helpers import rel_err, run_ort, run_tvm

from passctl.ir import from_onnx, to_onnx
from passctl.ir.errors import UserError
from passctl.targets import get_emitter, get_target
from passctl.targets.tvm import TvmEmitter
from passctl.targets.tvm.support import tvm_target

K, N = 24, 80  # N > frontend.SMALL_CONSTANT_ELEMENTS: the biases stay weights (parameters)


def _three_projections():
    """x [2, 8, K] -> three MatMul + bias Add branches (branch 1 writes Add(bias, MatMul), as
    torch's legacy exporter does) -> three outputs [2, 8, N]."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i in range(3):
        inits += [numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), f"b{i}")]
        add = [f"b{i}", f"m{i}"] if i == 1 else [f"m{i}", f"b{i}"]
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", add, [f"y{i}"])]
    graph = helper.make_graph(
        nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, K])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 8, N]) for i in range(3)],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pack_gpu_weights_matches_onnxruntime_on_cpu():
    import tvm
    from tvm import relax

    from passctl.targets.tvm.build import pack_gpu_weights
    from passctl.targets.tvm.frontend import to_relax

    proto = _three_projections()
    target = tvm_target(get_target("cpu"))
    mod, params = to_relax(from_onnx(proto), "qkv")
    assert mod["main"].script().count("R.matmul(") == 3 and len(params) == 6
    mod, transform = pack_gpu_weights(mod, target)
    main = mod["main"].script()
    assert transform == "main_transform_params"
    # one [K, 3N] GEMM whose parts are read through slices (which fuse into their consumers)
    assert main.count("R.matmul(") == 1 and "R.split(" not in main
    assert main.count("R.strided_slice(") == 3
    assert f"R.Tensor(({K}, {3 * N})" in main
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    packed = vm[transform](params)
    assert [tuple(p.shape) for p in packed] == [(K, 3 * N), (3 * N,)]
    x = np.random.default_rng(1).standard_normal((2, 8, K)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x), *packed)
    want = run_ort(proto, {"x": x})
    for i in range(3):
        np.testing.assert_allclose(got[i].numpy(), want[f"y{i}"], rtol=1e-5, atol=1e-5)


def test_packed_weights_dispatch_one_triton_gemm():
    from passctl.targets.tvm.build import pack_gpu_weights
    from passctl.targets.tvm.frontend import to_relax
    from passctl.targets.tvm.triton_dispatch import TritonLibrary, dispatch_gemms

    target = tvm_target(get_target("h200"))
    lib = TritonLibrary((9, 0), 132)
    mod, _ = to_relax(from_onnx(_three_projections()), "qkv", kernels=lib)
    mod, transform = pack_gpu_weights(mod, target)
    mod, count = dispatch_gemms(mod, lib)
    assert transform == "main_transform_params" and count == 1
    assert [e["what"] for e in lib.log] == [f"gemm 16x{K}x{3 * N} float32 +bias"]


# -- TvmEmitter options ------------------------------------------------------------------------

def test_emitter_rejects_unknown_kernels_and_precision():
    with pytest.raises(UserError, match=r"kernels='cublas': use 'auto', 'triton' or 'tvm'"):
        TvmEmitter(kernels="cublas")
    with pytest.raises(UserError, match=r"fp32_precision='fp16': use 'ieee', 'tf32' or 'tf32x3'"):
        TvmEmitter(fp32_precision="fp16")
    with pytest.raises(UserError, match=r"fp32_precision='bf16x9'.*'ieee', 'tf32' or 'tf32x3'"):
        get_emitter("tvm{fp32_precision=bf16x9}")
    emitter = get_emitter("tvm{kernels=tvm,fp32_precision=tf32x3,cuda_graph=false}")
    assert (emitter.kernels, emitter.fp32_precision, emitter.cuda_graph) == ("tvm", "tf32x3", False)


def _bias_gelu_model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"]),
             helper.make_node("Gelu", ["h"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, N])],
        [numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b")])
    return from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]))


@pytest.fixture
def no_cuda_runtime(monkeypatch):
    """TVM without its CUDA runtime (as on this machine and in CI, also where a driver exists)."""
    import tvm_ffi

    real = tvm_ffi.get_global_func
    monkeypatch.setattr(tvm_ffi, "get_global_func", lambda name, *a, **kw: (
        None if name == "ffi.Module.create.cuda" else real(name, *a, **kw)))


def test_auto_kernels_fall_back_to_dlight_without_cuda_runtime(tmp_path, no_cuda_runtime):
    from passctl.targets.tvm import triton_dispatch

    ok, why = triton_dispatch.available()
    assert not ok and "CUDA runtime" in why
    TvmEmitter(kernels="auto", tensorize=False).emit(_bias_gelu_model(), get_target("h200"),
                                                     str(tmp_path / "a"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["kernels"] == "tvm" and manifest["kernels_note"] == why
    assert "triton" not in manifest and manifest["tensor_cores"] is False
    assert manifest["target"]["arch"] == "sm_90" and manifest["profile"]["sm_count"] == 132
    assert manifest["cuda_graph"] is True
    assert (tmp_path / "a" / "model.so").stat().st_size > 0


def test_triton_kernels_asked_for_without_cuda_runtime_is_one_line_error(tmp_path, no_cuda_runtime):
    with pytest.raises(UserError) as info:
        TvmEmitter(kernels="triton").emit(_bias_gelu_model(), get_target("h200"), str(tmp_path / "a"))
    message = str(info.value)
    assert "\n" not in message and "'h200'" in message and "CUDA runtime" in message
    assert not (tmp_path / "a").exists()


def test_triton_path_writes_kernel_manifest(tmp_path, monkeypatch):
    """The emitter's Triton route up to the artifact, with the CUDA module step stubbed out (it
    needs TVM's CUDA runtime): pack, dispatch, manifest."""
    from passctl.targets.tvm import triton_dispatch

    monkeypatch.setattr(triton_dispatch, "available", lambda: (True, ""))
    monkeypatch.setattr(triton_dispatch.TritonLibrary, "modules", lambda self: [])
    TvmEmitter(kernels="triton", tune=False, fp32_precision="tf32x3", cuda_graph=False).emit(
        _bias_gelu_model(), get_target("h100"), str(tmp_path / "a"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["kernels"] == "triton" and "kernels_note" not in manifest
    assert manifest["cuda_graph"] is False and manifest["tensor_cores"] is True
    assert manifest["fp32_precision"] == "tf32x3"
    triton = manifest["triton"]
    assert triton["gemms"] == 1 and triton["tuned"] is False
    assert triton["fp32_precision"] == "tf32x3"
    assert [s["what"] for s in triton["specializations"]] == [f"gemm 16x{K}x{N} float32 +bias gelu"]
    assert triton["specializations"][0]["kernel"] == "passctl_gemm_kernel_0"


@pytest.mark.parametrize("name,sms", [("t4", 40), ("a10", 72), ("l4", 58), ("a100", 108),
                                      ("a100-40gb", 108), ("h100", 132), ("h200", 132), ("cpu", None)])
def test_target_profiles_sm_count(name, sms):
    profile = get_target(name)
    assert profile.sm_count == sms and profile.to_dict()["sm_count"] == sms


def test_cpu_artifact_unaffected_by_kernel_options(tmp_path):
    """kernels / fp32_precision are CUDA options: a cpu build ignores them and self-checks."""
    model = _bias_gelu_model()
    info = TvmEmitter(kernels="triton", fp32_precision="tf32").emit(model, get_target("cpu"),
                                                                    str(tmp_path / "a"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["kernels"] == "tvm" and "triton" not in manifest and "cuda_graph" not in manifest
    assert info["self_check"]["ok"] is True
    x = np.random.default_rng(2).standard_normal((2, 8, K)).astype(np.float32)
    got = run_tvm(tmp_path / "a", {"x": x})["y"]
    assert rel_err(got, run_ort(to_onnx(model), {"x": x})["y"]) <= 1e-5


def test_fp32_attention_mask_broadcast_over_keys_on_cpu(tmp_path):
    """An additive mask [1, 1, S, 1] (broadcast over keys) with GQA: TVM's fp32 nn.attention wants
    the bias's key axis materialized (targets/tvm/relax_attention.py broadcasts it); vs numpy."""
    shapes = {"q": [1, 2, 8, 16], "k": [1, 1, 8, 16], "m": [1, 1, 8, 1]}
    node = helper.make_node("Attention", ["q", "k", "k", "m"], ["y"], domain="passctl", scale=0.25,
                            mask_kind="additive", is_causal=0, num_heads=2, kv_num_heads=1,
                            softmax_precision=1, nan_to_zero=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("passctl", 1)])
    TvmEmitter().emit(from_onnx(model), get_target("cpu"), str(tmp_path / "a"))
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    k = feeds["k"].astype(np.float64)
    scores = 0.25 * feeds["q"].astype(np.float64) @ k.transpose(0, 1, 3, 2) + feeds["m"]
    p = np.exp(scores - scores.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ k
    assert rel_err(run_tvm(tmp_path / "a", feeds)["y"], want) <= 1e-5
