"""fuse-conv-activation: Conv + bias + activation / residual -> FusedConv; counts, ORT numerics, reasons."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from helpers import assert_same_outputs, assert_verifies, op_types, parse

from corpus import CORPUS
from fusion_helpers import model_text
from passctl.ir import from_onnx, load, to_onnx
from passctl.passes.common.infer_shapes import InferShapes
from passctl.passes.fusion.conv_activation import FuseConvActivation
from passctl.passes.rewrite import explain
from passctl.support.check import check_models

def _model(body: str, inputs: str, outputs: str, opset: int = 17, **arrays) -> onnx.ModelProto:
    return model_text(body, inputs, outputs, opset, arrays)


def _fuse(proto):
    """infer-shapes + fuse-conv-activation on ``proto``; returns (IR model, stats, exported proto)."""
    model = from_onnx(proto)
    InferShapes()(model)
    result = FuseConvActivation()(model)
    assert_verifies(model)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    return model, result.stats, out


def _weights(seed=0, c_in=4, c_out=6, k=3):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(c_out, c_in, k, k)).astype(np.float32) * 0.3,
            rng.normal(size=c_out).astype(np.float32))


def _node(proto, op_type):
    return next(n for n in proto.graph.node if n.op_type == op_type)


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


X = "float[1,4,9,9] x"
Y = "float[1,6,9,9] y"

ACTS = [
    # (activation text, expected FusedConv activation, expected activation_params, rule key)
    ("Relu (c)", "Relu", None, "relu"),
    ("Tanh (c)", "Tanh", None, "tanh"),
    ("Sigmoid (c)", "Sigmoid", None, "sigmoid"),
    ("LeakyRelu <alpha = 0.2> (c)", "LeakyRelu", [0.2], "leaky-relu"),
    ("LeakyRelu (c)", "LeakyRelu", [0.01], "leaky-relu"),
    ("HardSigmoid <alpha = 0.3, beta = 0.4> (c)", "HardSigmoid", [0.3, 0.4], "hard-sigmoid"),
    ("Clip (c, lo, hi)", "Clip", [0.0, 6.0], "clip"),
    ("Clip (c, lo)", "Clip", [0.0, float(np.finfo(np.float32).max)], "clip-min"),
]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("act, activation, params, key", ACTS,
                         ids=[a[3] + str(i) for i, a in enumerate(ACTS)])
def test_conv_activation_to_fusedconv(act, activation, params, key, bias):
    w, b = _weights()
    conv = "c = Conv <pads = [1,1,1,1]> (x, w, b)" if bias else "c = Conv <pads = [1,1,1,1]> (x, w)"
    arrays = dict(w=w, lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
    if bias:
        arrays["b"] = b
    proto = _model(f"{conv}\ny = {act}", X, Y, **arrays)
    _, stats, out = _fuse(proto)
    rule = ("conv-bias-" if bias else "conv-") + key
    assert stats == {"fused": 1, rule: 1}
    assert op_types(out) == ["FusedConv"]
    node = _node(out, "FusedConv")
    assert node.domain == "com.microsoft" and len(node.input) == (3 if bias else 2)
    attrs = _attrs(node)
    assert attrs["activation"].decode() == activation and attrs["pads"] == [1, 1, 1, 1]
    if params is None:
        assert "activation_params" not in attrs
    else:
        np.testing.assert_allclose(attrs["activation_params"], params, rtol=1e-7)
    assert {o.domain: o.version for o in out.opset_import}["com.microsoft"] == 1
    assert_same_outputs(proto, out)


def test_clip6_attributes_opset10():
    w, b = _weights(1)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Clip <min = 0.0, max = 6.0> (c)",
                   X, Y, opset=10, w=w, b=b)
    _, stats, out = _fuse(proto)
    assert stats == {"fused": 1, "conv-bias-clip-attr": 1}
    assert list(_attrs(_node(out, "FusedConv"))["activation_params"]) == [0.0, 6.0]
    assert_same_outputs(proto, out)


def test_bias_add_then_relu_strided_grouped():
    rng = np.random.default_rng(2)
    w = rng.normal(size=(6, 2, 3, 3)).astype(np.float32)
    c = rng.normal(size=(6, 1, 1)).astype(np.float32)
    proto = _model("t = Conv <group = 2, strides = [2,2]> (x, w)\nc = Add (cb, t)\ny = Relu (c)",
                   X, "float[1,6,4,4] y", w=w, cb=c)
    _, stats, out = _fuse(proto)
    assert stats == {"fused": 2, "conv-add-bias": 1, "conv-bias-relu": 1}
    assert op_types(out) == ["FusedConv"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(
        next(t for t in out.graph.initializer if t.name == _node(out, "FusedConv").input[2])),
        c.reshape(-1))
    assert _attrs(_node(out, "FusedConv"))["group"] == 2
    assert_same_outputs(proto, out)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_residual_add_relu(bias):
    w, b = _weights(3, c_in=6)
    conv = "c = Conv <pads = [1,1,1,1]> (x, w, b)" if bias else "c = Conv <pads = [1,1,1,1]> (x, w)"
    arrays = dict(w=w, b=b) if bias else dict(w=w)
    proto = _model(f"{conv}\ns = Add (x, c)\ny = Relu (s)", "float[1,6,9,9] x", Y, **arrays)
    _, stats, out = _fuse(proto)
    pre = "conv-bias-add" if bias else "conv-add"
    assert stats == {"fused": 2, pre: 1, f"{pre}-relu": 1}
    assert op_types(out) == ["FusedConv"]
    node = _node(out, "FusedConv")
    assert list(node.input)[3] == "x" and (node.input[2] != "") == bias
    assert_same_outputs(proto, out)


def test_residual_without_activation_and_two_convs():
    w, b = _weights(4, c_in=6)
    w2, _ = _weights(5, c_in=6)
    proto = _model("c1 = Conv <pads = [1,1,1,1]> (x, w, b)\nc2 = Conv <pads = [1,1,1,1]> (x, w2)\n"
                   "y = Add (c1, c2)", "float[1,6,9,9] x", Y, w=w, b=b, w2=w2)
    _, stats, out = _fuse(proto)
    assert stats["fused"] == 1 and sorted(op_types(out)) == ["Conv", "FusedConv"]
    assert_same_outputs(proto, out)


def _reason(proto, rule):
    model = from_onnx(proto)
    InferShapes()(model)
    return explain(rule, model)


@pytest.mark.parametrize("act, rule, reason", [
    ("y = HardSwish (c)", "conv-bias-hard-swish", "has no HardSwish activation"),
    ("s = Sigmoid (c)\ny = Mul (c, s)", "conv-bias-silu", "has no SiLU (x * Sigmoid(x)) activation"),
    ("s = HardSigmoid <alpha = 0.1666666, beta = 0.5> (c)\ny = Mul (s, c)", "conv-bias-hard-swish-mul",
     "has no HardSwish (x * HardSigmoid(x)) activation"),
])
def test_activation_fusedconv_lacks_stays_with_reason(act, rule, reason):
    w, b = _weights(6)
    proto = _model(f"c = Conv <pads = [1,1,1,1]> (x, w, b)\n{act}", X, Y, w=w, b=b)
    assert reason in _reason(proto, rule)
    _, stats, out = _fuse(proto)
    assert stats == {"fused": 0} and "FusedConv" not in op_types(out)


def test_gelu_opset20_stays_with_reason():
    w, b = _weights(7)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Gelu (c)", X, Y, opset=20, w=w, b=b)
    assert "has no Gelu activation" in _reason(proto, "conv-bias-gelu")
    assert _fuse(proto)[1] == {"fused": 0}


def test_clip_with_runtime_max_not_fused():
    w, b = _weights(8)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Clip (c, lo, hi)", X + ", float hi", Y,
                   w=w, b=b, lo=np.array(0.0, np.float32))
    assert "Clip's min/max is not a scalar constant" in _reason(proto, "conv-bias-clip")
    assert _fuse(proto)[1] == {"fused": 0}


def test_intermediate_with_another_consumer_not_fused():
    w, b = _weights(9)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Relu (c)\nz = Sigmoid (c)", X,
                   Y + ", float[1,6,9,9] z", w=w, b=b)
    assert "has another consumer outside the match" in _reason(proto, "conv-bias-relu")
    _, stats, out = _fuse(proto)
    assert stats == {"fused": 0} and op_types(out) == ["Conv", "Relu", "Sigmoid"]


def test_residual_that_broadcasts_not_fused():
    w, b = _weights(10)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Add (c, z)", X + ", float[1,6,1,9] z", Y,
                   w=w, b=b)
    assert "FusedConv's Z does not broadcast" in _reason(proto, "conv-bias-add")
    assert _fuse(proto)[1] == {"fused": 0}


def test_bias_of_wrong_shape_not_folded():
    w, b = _weights(11)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Add (c, k)", X, Y, w=w, b=b,
                   k=np.ones((1, 1, 1, 9), np.float32))
    assert "is not one value per output channel" in _reason(proto, "conv-bias-add-bias")


def test_float64_conv_not_fused():
    w, b = _weights(12)
    proto = _model("c = Conv <pads = [1,1,1,1]> (x, w, b)\ny = Relu (c)", "double[1,4,9,9] x",
                   "double[1,6,9,9] y", w=w.astype(np.float64), b=b.astype(np.float64))
    assert "float32 only" in _reason(proto, "conv-bias-relu")


# Absolute floor of the real-model checks: two float32 ulps at 1.0. ppocr_det's random-input text
# probabilities are all < 1e-5, where ONNX Runtime's Sigmoid returns values in steps of 2**-23, so
# cleanup + fuse-conv-bn alone already gives a "relative" error of 1.4e-2 on that output.
ATOL = 2 * float(np.finfo(np.float32).eps)
# cleanup + fuse-conv-bn + H9's fusion families (conv + activation, Gemm, Reshape chains).
PIPELINE = ("cleanup,fuse-conv-bn,infer-shapes,fuse-reshape-chains,eliminate-identity,fuse-conv-activation,"
            "fuse-gemm")


@pytest.mark.parametrize("model_id, expected", [
    ("ppocr_det", {"fuse-conv-activation": {"fused": 21, "conv-bias-relu": 11, "conv-bias-hard-sigmoid": 10},
                   "fuse-gemm": {"fused": 0}, "fuse-reshape-chains": {"fused": 0}}),
    ("ppocr_cls", {"fuse-conv-activation": {"fused": 42, "conv-add-bias": 18, "conv-bias-relu": 15,
                                            "conv-bias-hard-sigmoid": 9},
                   "fuse-gemm": {"fused": 1, "matmul-add-gemm": 1}, "fuse-reshape-chains": {"fused": 0}}),
])
def test_ppocr_counts_and_numerics(model_id, expected):
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline

    entry = CORPUS[model_id]
    model = load(entry.path)
    result = PassManager(build_pipeline(PIPELINE)).run(model)
    stats = {r.name: r.stats for r in result.records if r.name in expected}
    assert stats == expected
    out = to_onnx(model)
    conv_stats = expected["fuse-conv-activation"]
    fused = [n for n in out.graph.node if n.op_type == "FusedConv"]
    assert len(fused) == conv_stats["fused"] - conv_stats.get("conv-add-bias", 0)
    assert sum(n.op_type == "Gemm" for n in out.graph.node) == expected["fuse-gemm"]["fused"]
    # Every Conv -> Relu / HardSigmoid pair left has another consumer of the Conv output.
    producers = {o: n for n in out.graph.node for o in n.output}
    for n in out.graph.node:
        conv = producers.get(n.input[0]) if n.op_type in ("Relu", "HardSigmoid") else None
        if conv is not None and conv.op_type == "Conv":
            assert sum(n.input[0] in m.input for m in out.graph.node) > 1
    check = check_models(entry.path, out, inputs=entry.inputs(seed=0))
    assert check.ok(1e-5, atol=ATOL), str(check)


def test_inside_a_model_local_function_gets_the_domain_import():
    text = '<ir_version: 8, opset_import: ["" : 17, "local" : 1]>' + """
        g (float[1,2,4,4] x) => (float[1,1,4,4] y) {
            y = local.ConvRelu (x)
        }
        <domain: "local", opset_import: ["" : 17]>
        ConvRelu (a) => (b) {
            k = Constant <value = float[1,2,1,1] {0.5, -0.25}> ()
            c = Conv (a, k)
            b = Relu (c)
        }"""
    proto = parse(text)
    model = from_onnx(proto)
    assert FuseConvActivation()(model).stats == {"fused": 1, "conv-relu": 1}
    out = to_onnx(model)
    onnx.checker.check_model(out)
    fn = out.functions[0]
    assert [n.op_type for n in fn.node] == ["Constant", "FusedConv"]
    assert {o.domain for o in fn.opset_import} >= {"com.microsoft"}
    assert_same_outputs(proto, out)
