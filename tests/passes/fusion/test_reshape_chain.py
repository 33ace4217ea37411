"""fuse-reshape-chains: Reshape/Transpose chains and Squeeze/Unsqueeze pairs; ORT numerics, allowzero."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from helpers import assert_same_outputs, assert_verifies, op_types

from fusion_helpers import model_text
from passctl.ir import from_onnx, to_onnx
from passctl.passes.common.eliminate_identity import EliminateIdentity
from passctl.passes.common.infer_shapes import InferShapes
from passctl.passes.fusion.reshape_chain import FuseReshapeChains, collapsed_shape, compose_perms
from passctl.passes.rewrite import explain


def _model(body: str, inputs: str, outputs: str, opset: int = 17, **arrays) -> onnx.ModelProto:
    return model_text(body, inputs, outputs, opset, arrays)


def _fuse(proto, shapes=True):
    model = from_onnx(proto)
    if shapes:
        InferShapes()(model)
    result = FuseReshapeChains()(model)
    assert_verifies(model)
    out = to_onnx(model)
    onnx.checker.check_model(out)
    return result.stats, out


def _reason(proto, rule, shapes=True):
    model = from_onnx(proto)
    if shapes:
        InferShapes()(model)
    return explain(rule, model)


def _shape_of(proto):
    r = next(n for n in proto.graph.node if n.op_type == "Reshape")
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    return arrays[r.input[1]].tolist(), {a.name: a.i for a in r.attribute}.get("allowzero", 0)


def _i64(*v):
    return np.array(v, np.int64)


@pytest.mark.parametrize("s1, s2, x_shape, y_shape, expected", [
    ((6, 20), (2, 3, -1), "float[2,3,4,5] x", "float[2,3,20] y", [2, 3, -1]),
    ((0, 0, 20), (0, 60), "float[2,3,4,5] x", "float[2,60] y", [0, 60]),  # copy of a copy -> copy
    ((-1, 20), (0, 4, 5), "float[2,3,4,5] x", "float[6,4,5] y", [6, 4, 5]),  # copy of a -1: static dim
    ((3, 40), (0, -1), "float[2,3,4,5] x", "float[3,40] y", [3, -1]),  # copy of a constant dim
], ids=["plain", "copy-copy", "copy-inferred", "copy-constant"])
def test_reshape_reshape(s1, s2, x_shape, y_shape, expected):
    proto = _model("t = Reshape (x, s1)\ny = Reshape (t, s2)", x_shape, y_shape, s1=_i64(*s1), s2=_i64(*s2))
    stats, out = _fuse(proto)
    assert stats == {"fused": 1, "reshape-reshape": 1}
    assert op_types(out) == ["Reshape"] and _shape_of(out) == (expected, 0)
    assert_same_outputs(proto, out)


def test_reshape_chain_of_three_symbolic_batch():
    proto = _model("a = Reshape (x, s1)\nb = Reshape (a, s2)\ny = Reshape (b, s3)", "float[N,4,6] x",
                   "float[N,24] y", s1=_i64(0, 24), s2=_i64(0, 2, 12), s3=_i64(0, -1))
    stats, out = _fuse(proto)
    assert stats == {"fused": 2, "reshape-reshape": 2}
    assert op_types(out) == ["Reshape"] and _shape_of(out) == ([0, -1], 0)
    feeds = {"x": np.random.default_rng(0).normal(size=(3, 4, 6)).astype(np.float32)}
    assert_same_outputs(proto, out, inputs=feeds)


def test_allowzero_second_reshape_keeps_literal_zero():
    proto = _model("t = Reshape (x, s1)\ny = Reshape <allowzero = 1> (t, s2)", "float[0,4] x", "float[4,0] y",
                   s1=_i64(0, 2, 2), s2=_i64(4, 0))
    stats, out = _fuse(proto)
    assert stats["reshape-reshape"] == 1 and _shape_of(out) == ([4, 0], 1)
    assert_same_outputs(proto, out, inputs={"x": np.zeros((0, 4), np.float32)})


def test_copied_zero_of_an_inferred_dim_without_shapes_not_collapsed():
    # Without infer-shapes the intermediate dim 0 is "-1" of the first Reshape: unknown.
    proto = _model("t = Reshape (x, s1)\ny = Reshape (t, s2)", "float[N,4,5] x", "float[M,4,5] y",
                   s1=_i64(-1, 20), s2=_i64(0, 4, 5))
    assert "neither static nor a positive constant" in _reason(proto, "reshape-reshape", shapes=False)
    stats, out = _fuse(proto, shapes=False)
    assert stats == {"fused": 0} and op_types(out) == ["Reshape", "Reshape"]


def test_allowzero_difference_not_collapsed():
    # The first Reshape makes a literal 0-size dim (allowzero=1); the second copies it (allowzero=0):
    # one Reshape of x cannot say "copy" for a dim x does not have.
    proto = _model("t = Reshape <allowzero = 1> (x, s1)\ny = Reshape (t, s2)", "float[N,4] x", "float[M,4] y",
                   s1=_i64(0, 4, 1), s2=_i64(0, 4))
    text = _reason(proto, "reshape-reshape", shapes=False)
    assert "allowzero differences" in text
    assert _fuse(proto, shapes=False)[0] == {"fused": 0}


def test_collapsed_shape_math():
    assert collapsed_shape(_i64(0, 0, 20), 0, _i64(0, 60), 0, None) == ([0, 60], 0)
    assert collapsed_shape(None, 0, _i64(2, -1), 0, None) == ([2, -1], 0)
    assert isinstance(collapsed_shape(None, 0, _i64(0, -1), 0, None), str)
    assert collapsed_shape(None, 0, _i64(0, -1), 0, (7, "n")) == ([7, -1], 0)


def test_reshape_with_another_consumer_not_collapsed():
    proto = _model("t = Reshape (x, s1)\ny = Reshape (t, s2)\nz = Relu (t)", "float[2,12] x",
                   "float[4,6] y, float[24] z", s1=_i64(24), s2=_i64(4, 6))
    assert "has another consumer outside the match" in _reason(proto, "reshape-reshape")
    assert _fuse(proto)[0] == {"fused": 0}


@pytest.mark.parametrize("p1, p2, expected", [
    ([0, 2, 3, 1], [0, 3, 1, 2], None),  # NHWC <-> NCHW cancel
    ([1, 0, 2, 3], [0, 2, 1, 3], [1, 2, 0, 3]),
    (None, [3, 2, 1, 0], None),  # reverse then reverse
    ([0, 2, 1, 3], None, [3, 1, 2, 0]),
])
def test_transpose_transpose(p1, p2, expected):
    a1 = "" if p1 is None else f" <perm = {p1}>"
    a2 = "" if p2 is None else f" <perm = {p2}>"
    dims = [[2, 3, 4, 5][i] for i in compose_perms(p1, p2, 4)]
    proto = _model(f"t = Transpose{a1} (x)\ny = Transpose{a2} (t)", "float[2,3,4,5] x",
                   f"float[{','.join(map(str, dims))}] y")
    stats, out = _fuse(proto)
    assert stats == {"fused": 1, "transpose-transpose": 1}
    if expected is None:
        assert op_types(out) == ["Identity"]
        model = from_onnx(out)
        EliminateIdentity()(model)
        assert len(list(model.graph)) <= 1
    else:
        t = out.graph.node[0]
        assert op_types(out) == ["Transpose"] and list(t.attribute[0].ints) == expected
    assert_same_outputs(proto, out)


def test_compose_perms_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 4, 5))
    for _ in range(20):
        p1, p2 = list(rng.permutation(4)), list(rng.permutation(4))
        np.testing.assert_array_equal(np.transpose(np.transpose(x, p1), p2),
                                      np.transpose(x, compose_perms(p1, p2, 4)))


def test_transpose_without_perm_and_unknown_rank_not_composed():
    proto = _model("t = Transpose (x)\ny = Transpose <perm = [1, 0]> (t)", "float[2,3] x", "float[2,3] y")
    model = from_onnx(proto)
    for v in model.graph.inputs:
        v.type = None
    assert "rank is unknown" in explain("transpose-transpose", model)


@pytest.mark.parametrize("opset, body, x_shape", [
    (17, "t = Squeeze (x, a)\ny = Unsqueeze (t, a)", "float[2,1,3] x"),
    (17, "t = Squeeze (x, a)\ny = Unsqueeze (t, b)", "float[2,1,3] x"),  # -2 vs 1 on rank 3
    (17, "t = Unsqueeze (x, a)\ny = Squeeze (t, a)", "float[2,3] x"),
    (17, "t = Unsqueeze (x, c)\ny = Squeeze (t)", "float[2,3] x"),  # no 1-dims in x
    (11, "t = Squeeze <axes = [1]> (x)\ny = Unsqueeze <axes = [-2]> (t)", "float[2,1,3] x"),
    (11, "t = Squeeze (x)\ny = Unsqueeze <axes = [0, 2]> (t)", "float[1,4,1] x"),
    (11, "t = Unsqueeze <axes = [0, 3]> (x)\ny = Squeeze <axes = [3, 0]> (t)", "float[2,3] x"),
], ids=["sq-unsq", "sq-unsq-negative", "unsq-sq", "unsq-sq-noaxes", "attr", "attr-noaxes", "attr-unsq-sq"])
def test_squeeze_unsqueeze_pairs_cancel(opset, body, x_shape):
    arrays = {} if opset < 13 else dict(a=_i64(1), b=_i64(-2), c=_i64(0, -1))
    proto = _model(body, x_shape, x_shape.replace(" x", " y"), opset=opset, **arrays)
    stats, out = _fuse(proto)
    assert stats["fused"] == 1 and op_types(out) == ["Identity"]
    assert_same_outputs(proto, out)


@pytest.mark.parametrize("body, x_shape, y_shape, reason", [
    ("t = Squeeze (x, a)\ny = Unsqueeze (t, z)", "float[2,1,3] x", "float[1,2,3] y",
     "differ: they do not cancel"),
    ("t = Unsqueeze (x, a)\ny = Squeeze (t)", "float[2,1] x", "float[2] y", "would also drop size-1"),
    ("t = Squeeze (x)\ny = Unsqueeze (t, a)", "float[N,1] x", "float[N,1] y", "not static"),
])
def test_squeeze_unsqueeze_that_differ_stay(body, x_shape, y_shape, reason):
    proto = _model(body, x_shape, y_shape, a=_i64(1), z=_i64(0))
    rules = ["squeeze-unsqueeze-input-input", "unsqueeze-squeeze-input-attr", "squeeze-unsqueeze-attr-input"]
    assert any(reason in _reason(proto, r) for r in rules)
    assert _fuse(proto)[0] == {"fused": 0}
