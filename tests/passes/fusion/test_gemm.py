"""fuse-gemm: MatMul + Add -> Gemm, Transpose folding; counts, ORT numerics, reasons it does not fire."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from helpers import assert_same_outputs, assert_verifies, op_types

from fusion_helpers import model_text
from passctl.ir import from_onnx, to_onnx
from passctl.passes.common.infer_shapes import InferShapes
from passctl.passes.fusion.gemm import FuseGemm
from passctl.passes.rewrite import explain


def _model(body: str, inputs: str, outputs: str, opset: int = 17, **arrays) -> onnx.ModelProto:
    return model_text(body, inputs, outputs, opset, arrays)


def _fuse(proto):
    model = from_onnx(proto)
    InferShapes()(model)
    result = FuseGemm()(model)
    assert_verifies(model)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    return result.stats, out


def _reason(proto, rule):
    model = from_onnx(proto)
    InferShapes()(model)
    return explain(rule, model)


def _rand(seed, *shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _node(proto, op_type):
    return next(n for n in proto.graph.node if n.op_type == op_type)


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("bias_shape", [(6,), (1, 6), (4, 6), (4, 1), ()], ids=str)
@pytest.mark.parametrize("order", ["Add (m, c)", "Add (c, m)"])
def test_matmul_add_to_gemm(bias_shape, order):
    proto = _model(f"m = MatMul (a, w)\ny = {order}", "float[4,8] a", "float[4,6] y",
                   w=_rand(0, 8, 6), c=_rand(1, *bias_shape))
    stats, out = _fuse(proto)
    assert stats == {"fused": 1, "matmul-add-gemm": 1}
    assert op_types(out) == ["Gemm"] and list(_node(out, "Gemm").input) == ["a", "w", "c"]
    assert_same_outputs(proto, out)


def test_runtime_bias_input():
    proto = _model("m = MatMul (a, w)\ny = Add (m, c)", "float[4,8] a, float[6] c", "float[4,6] y",
                   w=_rand(2, 8, 6))
    stats, out = _fuse(proto)
    assert stats["matmul-add-gemm"] == 1
    assert_same_outputs(proto, out)


def test_transposed_weight_then_bias_becomes_gemm_transb():
    w = _rand(3, 6, 8)
    proto = _model("t = Transpose <perm = [1, 0]> (w)\nm = MatMul (a, t)\ny = Add (m, c)", "float[4,8] a",
                   "float[4,6] y", w=w, c=_rand(4, 6))
    stats, out = _fuse(proto)
    assert stats == {"fused": 2, "matmul-transpose-b": 1, "gemm-add": 1}
    gemm = _node(out, "Gemm")
    assert op_types(out) == ["Gemm"] and list(gemm.input) == ["a", "w", "c"]
    assert _attrs(gemm) == {"transB": 1}
    assert_same_outputs(proto, out)


def test_transposed_activation_2d_to_gemm_transa():
    proto = _model("t = Transpose (a)\ny = MatMul (t, b)", "float[8,4] a, float[8,6] b", "float[4,6] y")
    stats, out = _fuse(proto)
    assert stats == {"fused": 1, "matmul-transpose-a": 1}
    assert op_types(out) == ["Gemm"] and _attrs(_node(out, "Gemm")) == {"transA": 1}
    assert_same_outputs(proto, out)


@pytest.mark.parametrize("body, inputs, out_shape, flag", [
    ("t = Transpose <perm = [0, 1, 3, 2]> (q)\ny = MatMul (t, k)", "float[2,3,5,4] q, float[2,3,5,6] k",
     "float[2,3,4,6] y", "transA"),
    ("t = Transpose <perm = [0, 2, 1]> (k)\ny = MatMul (q, t)", "float[2,4,5] q, float[2,6,5] k",
     "float[2,4,6] y", "transB"),
    ("t = Transpose <perm = [0, 1, 3, 2]> (k)\ny = MatMul (q, t)", "float[3,4,5] q, float[2,1,6,5] k",
     "float[2,3,4,6] y", "transB"),
], ids=["4d-a", "3d-b", "broadcast-b"])
def test_batched_transpose_to_fusedmatmul(body, inputs, out_shape, flag):
    proto = _model(body, inputs, out_shape)
    stats, out = _fuse(proto)
    assert stats["fused"] == 1
    node = _node(out, "FusedMatMul")
    assert node.domain == "com.microsoft" and _attrs(node) == {flag: 1}
    assert {o.domain: o.version for o in out.opset_import}["com.microsoft"] == 1
    assert_same_outputs(proto, out)


def test_batched_constant_weight_gets_new_initializer_old_one_unchanged():
    w = _rand(5, 6, 8)
    proto = _model("t = Transpose (w)\ny = MatMul (x, t)\nz = MatMul (w, v)", "float[2,5,8] x, float[8,3] v",
                   "float[2,5,6] y, float[6,3] z", w=w)
    stats, out = _fuse(proto)
    assert stats == {"fused": 1, "matmul-transpose-b": 1}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    np.testing.assert_array_equal(inits["w"], w)
    mm = next(n for n in out.graph.node if n.output[0] == "y")
    assert mm.op_type == "MatMul" and mm.input[1] != "w"
    np.testing.assert_array_equal(inits[mm.input[1]], w.T)
    assert_same_outputs(proto, out)


@pytest.mark.parametrize("body, attrs", [
    ("t = Transpose (a)\ny = Gemm <transB = 1> (t, b, c)", {"transA": 1, "transB": 1}),
    ("t = Transpose <perm = [1, 0]> (b2)\ny = Gemm <transB = 1, alpha = 0.5> (a2, t, c)",
     {"alpha": 0.5}),
    ("t = Transpose (b)\ny = Gemm <beta = 2.0> (a2, t)", {"beta": 2.0, "transB": 1}),
], ids=["a", "b-toggle", "b-no-c"])
def test_gemm_transpose_folded(body, attrs):
    proto = _model(body, "float[8,4] a, float[4,8] a2, float[6,8] b, float[8,6] b2, float[6] c",
                   "float[4,6] y")
    stats, out = _fuse(proto)
    assert stats["fused"] == 1 and op_types(out) == ["Gemm"]
    assert _attrs(_node(out, "Gemm")) == attrs
    assert_same_outputs(proto, out)


# Item 6 of issue 4: a fusion whose math would differ does not fire, and explain says why.
def test_bias_that_broadcasts_to_rank3_not_fused():
    proto = _model("m = MatMul (a, w)\ny = Add (m, c)", "float[4,8] a", "float[2,4,6] y",
                   w=_rand(6, 8, 6), c=_rand(7, 2, 4, 6))
    assert "does not broadcast to Gemm's [M, N]" in _reason(proto, "matmul-add-gemm")
    stats, out = _fuse(proto)
    assert stats == {"fused": 0} and op_types(out) == ["MatMul", "Add"]


def test_bias_rows_that_differ_not_fused():
    proto = _model("m = MatMul (a, w)\ny = Add (m, c)", "float[1,8] a", "float[3,6] y",
                   w=_rand(8, 8, 6), c=_rand(9, 3, 6))
    assert "does not broadcast to Gemm's [M, N] = [1, 6]" in _reason(proto, "matmul-add-gemm")
    assert _fuse(proto)[0] == {"fused": 0}


def test_batched_matmul_add_stays_with_reason():
    proto = _model("m = MatMul (a, w)\ny = Add (m, c)", "float[2,4,8] a", "float[2,4,6] y",
                   w=_rand(10, 8, 6), c=_rand(11, 6))
    assert "ONNX Runtime fuses batched MatMul + Add itself" in _reason(proto, "matmul-add-gemm")
    assert _fuse(proto)[0] == {"fused": 0}


def test_matmul_with_another_consumer_not_fused():
    proto = _model("m = MatMul (a, w)\ny = Add (m, c)\nz = Relu (m)", "float[4,8] a",
                   "float[4,6] y, float[4,6] z", w=_rand(12, 8, 6), c=_rand(13, 6))
    assert "has another consumer outside the match" in _reason(proto, "matmul-add-gemm")
    assert _fuse(proto)[0] == {"fused": 0}


def test_runtime_b_not_fused():
    proto = _model("m = MatMul (a, b)\ny = Add (m, c)", "float[4,8] a, float[8,6] b", "float[4,6] y",
                   c=_rand(14, 6))
    assert "is not a constant weight" in _reason(proto, "matmul-add-gemm")


def test_transpose_of_batch_axes_not_folded():
    proto = _model("t = Transpose <perm = [1, 0, 2]> (a)\ny = MatMul (t, b)", "float[3,2,5] a, float[5,4] b",
                   "float[2,3,4] y")
    assert "does not swap only the last two axes" in _reason(proto, "matmul-transpose-a")
    assert _fuse(proto)[0] == {"fused": 0}


def test_int64_matmul_not_fused():
    proto = _model("t = Transpose (a)\ny = MatMul (t, b)", "int64[8,4] a, int64[8,6] b", "int64[4,6] y")
    assert "Gemm is fused only for float32/float64" in _reason(proto, "matmul-transpose-a")


def test_standard_variant_leaves_batched_transpose_with_reason():
    from passctl.passes.fusion.gemm import FuseGemmStandard

    proto = _model("t = Transpose <perm = [0, 2, 1]> (k)\ny = MatMul (q, t)",
                   "float[2,4,5] q, float[2,6,5] k", "float[2,4,6] y")
    model = from_onnx(proto)
    InferShapes()(model)
    assert FuseGemmStandard()(model).stats == {"fused": 0}
    # The 2-D case is still folded into Gemm by the standard variant.
    proto2 = _model("t = Transpose (b)\ny = MatMul (a, t)", "float[4,8] a, float[6,8] b", "float[4,6] y")
    model2 = from_onnx(proto2)
    InferShapes()(model2)
    assert FuseGemmStandard()(model2).stats == {"fused": 1, "matmul-transpose-b": 1}
    assert_same_outputs(proto2, to_onnx(model2))
