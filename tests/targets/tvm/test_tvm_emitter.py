"""TVM emitter on small models: artifact files, passctl:: op converters vs numpy, errors before the build."""

import json
import math

import numpy as np
import onnx
import pytest
from tvm_helpers import attention_numpy, attention_proto, emit_tvm, ir, rel_err, run_ort, run_tvm
from onnx import TensorProto, helper, numpy_helper

from passctl.ir.errors import UserError
from passctl.targets.tvm.runtime import read_manifest

RNG = np.random.default_rng(3)


def _conv_model(n=1) -> onnx.ModelProto:
    w = numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 8, 1, 1])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bound_call_matches_run(tmp_path):
    """TvmArtifact.bind (the benchmarks' timing call) computes what run does, and checks inputs."""
    from passctl.targets.tvm import load_artifact

    proto = _conv_model()
    emit_tvm(ir(proto), tmp_path / "a", self_check=False)
    art = load_artifact(str(tmp_path / "a"))
    x = RNG.uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    out = art.bind({"x": x})()
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    assert rel_err(got, run_ort(proto, {"x": x})["y"]) < 1e-5
    with pytest.raises(ValueError, match=r"input 'x' has shape \[1, 3, 8, 8\]"):
        art.bind({"x": x[:, :, :8, :8]})


def test_artifact_files_manifest_and_outputs(tmp_path):
    proto = _conv_model()
    info = emit_tvm(ir(proto), tmp_path / "a")
    assert sorted(info["files"]) == ["ir.onnx", "manifest.json", "model.params", "model.so"]
    manifest = read_manifest(str(tmp_path / "a"))
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]
    assert manifest["outputs"] == [{"name": "y", "shape": [1, 8, 1, 1], "dtype": "float32"}]
    assert manifest["device"] == "cpu" and manifest["target"]["kind"] == "llvm"
    assert manifest["target"]["mcpu"]  # the host CPU, not generic
    x = RNG.uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    got = run_tvm(tmp_path / "a", {"x": x})["y"]
    want = run_ort(proto, {"x": x})["y"]
    assert rel_err(got, want) < 1e-5
    assert info["self_check"]["ok"] is True
    # The 216 float32 conv weights live in model.params; the 8-element bias (<= 64 elements) is a
    # constant compiled into the library (frontend.SMALL_CONSTANT_ELEMENTS).
    assert info["weight_bytes"] == 8 * 3 * 3 * 3 * 4


def _passctl_model(op: str, inputs, attrs=None, d=32) -> onnx.ModelProto:
    inits, names = [], []
    for name, arr in inputs[1:]:
        if arr is not None:
            inits.append(numpy_helper.from_array(arr, name))
        names.append(name if arr is not None else "")
    x_names = [inputs[0][0]]
    graph_inputs = [helper.make_tensor_value_info(inputs[0][0], TensorProto.FLOAT, [2, 5, d])]
    if op == "SkipLayerNorm":
        graph_inputs.append(helper.make_tensor_value_info("skip", TensorProto.FLOAT, [2, 5, d]))
        x_names.append("skip")
        names = names[1:]
    node = helper.make_node(op, x_names + names, ["y"], domain="passctl", name="n0", **(attrs or {}))
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("passctl", 1)])


D = 32
SCALE = RNG.uniform(0.5, 1.5, D).astype(np.float32)
BIAS = RNG.uniform(-0.5, 0.5, D).astype(np.float32)
X = RNG.uniform(-2, 2, (2, 5, D)).astype(np.float32)
SKIP = RNG.uniform(-2, 2, (2, 5, D)).astype(np.float32)
erf = np.vectorize(math.erf)


def _ln(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


CASES = {
    "LayerNorm": (("X", None), [("X", None), ("scale", SCALE), ("b", BIAS)], {"epsilon": 1e-5},
                  lambda: _ln(X, SCALE, BIAS, 1e-5)),
    "LayerNorm-noscale": (("X", None), [("X", None), ("scale", None), ("b", None)],
                          {"epsilon": 1e-3}, lambda: _ln(X, 1.0, 0.0, 1e-3)),
    "SkipLayerNorm": (("X", None), [("X", None), ("skip", None), ("scale", SCALE), ("b", BIAS),
                                    ("bias", BIAS[::-1].copy())], {"epsilon": 1e-6},
                      lambda: _ln(X + SKIP + BIAS[::-1], SCALE, BIAS, 1e-6)),
    "RMSNorm": (("X", None), [("X", None), ("scale", SCALE)], {"epsilon": 1e-6},
                lambda: X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-6) * SCALE),
    "Gelu": (("X", None), [("X", None), ("bias", BIAS)], {"approximate": "none"},
             lambda: 0.5 * (X + BIAS) * (1 + erf((X + BIAS) / math.sqrt(2)))),
    "Gelu-tanh": (("X", None), [("X", None)], {"approximate": "tanh"},
                  lambda: 0.5 * X * (1 + np.tanh(math.sqrt(2 / math.pi) * (X + 0.044715 * X ** 3)))),
    "SiLU": (("X", None), [("X", None)], {}, lambda: X / (1 + np.exp(-X))),
    "HardSwish": (("X", None), [("X", None)], {}, lambda: X * np.clip(X / 6 + 0.5, 0, 1)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_passctl_ops_match_numpy(case, tmp_path):
    """Each canonical op's Relax mapping against the math of dialect/canonical.py in numpy."""
    _, inputs, attrs, reference = CASES[case]
    op = case.split("-")[0]
    proto = _passctl_model(op, inputs, attrs)
    emit_tvm(ir(proto), tmp_path / "a", self_check=False)
    feeds = {"X": X, "skip": SKIP} if op == "SkipLayerNorm" else {"X": X}
    got = run_tvm(tmp_path / "a", feeds)["y"]
    assert rel_err(got, reference()) < 2e-6, case


def test_unsupported_op_reported_before_build_with_provenance(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("FastGelu", ["r"], ["y"], domain="com.microsoft", name="enc/gelu_3")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model = ir(proto)
    next(n for n in model.graph if n.name == "enc/gelu_3").provenance = ("bert/gelu", "bert/mul")
    with pytest.raises(UserError) as info:
        emit_tvm(model, tmp_path / "a")
    msg = str(info.value)
    assert "\n" not in msg
    assert "node 'enc/gelu_3' (op com.microsoft::FastGelu, from bert/gelu, bert/mul)" in msg
    assert "lower-standard" in msg
    assert not (tmp_path / "a").exists()


def test_unknown_onnx_op_and_unmapped_passctl_op(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("SelectiveScan", ["x"], ["a"], domain="passctl", name="attn"),
         helper.make_node("Relu", ["a"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("passctl", 1)])
    with pytest.raises(UserError, match=r"node 'attn' \(op passctl::SelectiveScan, from attn\).*"
                                        r"maps passctl::Attention, passctl::Gelu"):
        emit_tvm(from_onnx_unchecked(proto), tmp_path / "a")
    graph = helper.make_graph(
        [helper.make_node("StringNormalizer", ["s"], ["y"], name="norm")],
        "g", [helper.make_tensor_value_info("s", TensorProto.STRING, [3])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [3])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UserError, match=r"node 'norm' \(op StringNormalizer.*no converter"):
        emit_tvm(ir(proto), tmp_path / "b")


def from_onnx_unchecked(proto):
    from passctl.ir import from_onnx

    return from_onnx(proto)


def test_symbolic_input_needs_lower_tvm_dims(tmp_path):
    proto = _conv_model()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(UserError, match=r"graph input 'x' has symbolic dims \['batch', 3, 16, 16\].*"
                                        r"lower-tvm\{dims=\"batch=SIZE\"\}"):
        emit_tvm(ir(proto), tmp_path / "a")


def test_cuda_cross_compile_for_profile_arch(tmp_path):
    """GPU profiles build for cuda with the profile's sm (NVRTC from cuda-python is here)."""
    info = emit_tvm(ir(_conv_model()), tmp_path / "a", target="a10")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["target"]["arch"] == "sm_86"
    assert info["self_check"] is None  # no GPU here: written, not run
    assert (tmp_path / "a" / "model.so").stat().st_size > 0
    # the default: no DLight WMMA schedules (TVM 0.27's Tensorize segfaults on fp16 matmuls)
    assert manifest["tensor_cores"] is False and manifest["transform_params"] is None


def test_cuda_build_with_dlight_tensor_cores(tmp_path):
    """tensorize=True: DLight's default schedules, tensor-core matmul rule included (fp32 here:
    the fp16 Tensorize crash is TVM's)."""
    from passctl.targets import get_target
    from passctl.targets.tvm import TvmEmitter

    TvmEmitter(tensorize=True).emit(ir(_conv_model()), get_target("h200"), str(tmp_path / "a"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["target"]["arch"] == "sm_90" and manifest["tensor_cores"] is True


def test_gpu_target_without_cuda_compiler_says_what_is_missing(tmp_path, monkeypatch):
    import importlib.util
    import shutil

    real = importlib.util.find_spec
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("cuda") else real(name, *a))
    with pytest.raises(UserError, match=r"target 't4' \(sm_75\).*neither; pip install cuda-python"):
        emit_tvm(ir(_conv_model()), tmp_path / "a", target="t4")
    assert not (tmp_path / "a").exists()


def test_passctl_attention_gqa_causal_matches_numpy(tmp_path):
    """passctl::Attention (targets/tvm/relax_attention.py's converter, merged into the emitter's
    table): H=4 query heads on 2 KV heads, causal, against softmax(scale Q.K^T + causal) V."""
    h, hkv, s, d = 4, 2, 8, 16
    proto = attention_proto(TensorProto.FLOAT, h, hkv, s, d, causal=1)
    emit_tvm(from_onnx_unchecked(proto), tmp_path / "a", self_check=False)
    q = RNG.standard_normal((1, h, s, d)).astype(np.float32)
    k = RNG.standard_normal((1, hkv, s, d)).astype(np.float32)
    v = RNG.standard_normal((1, hkv, s, d)).astype(np.float32)
    got = run_tvm(tmp_path / "a", {"q": q, "k": k, "v": v})["y"]
    want = attention_numpy(q, k, v, 0.25, np.triu(np.full((s, s), -np.inf), 1))
    assert rel_err(got, want) < 1e-5
