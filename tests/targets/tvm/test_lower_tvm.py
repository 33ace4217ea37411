"""lower-tvm: static dims fold Shape chains; scalar ConstantOfShape (BERT's TVM import failure) rewritten."""

import numpy as np
import onnx.parser
import pytest
from tvm_helpers import emit_tvm, rel_err, run_ort, run_tvm

from passctl.ir import from_onnx, to_onnx
from passctl.ir.errors import UserError
from passctl.passes.lowering.lower_tvm import LowerTvm
from passctl.support.dims import parse_dims
from passctl.targets.tvm import TvmTranslationError

# The attention-mask prologue of a transformers 5 BERT export, reduced: a scalar ConstantOfShape
# (shape input = empty 1-D tensor) feeding And, and an Expand to a shape computed from Shape(x).
MASK = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch, 4] x, bool[batch, 4] m) => (float[batch, 4] y) {
    empty = Constant <value = int64[0] {}> ()
    t = ConstantOfShape <value = bool[1] {1}> (empty)
    keep = And (m, t)
    s = Shape (x)
    e = Expand (keep, s)
    zero = Constant <value = float {0.0}> ()
    y = Where (e, x, zero)
}
"""


def _model():
    return from_onnx(onnx.parser.parse_model(MASK))


def test_scalar_constant_of_shape_fails_in_tvm_without_lower_tvm(tmp_path):
    model = _model()
    LowerTvm(dims="batch=2")  # options parse
    for v in model.graph.inputs:  # static shapes, but no legalization
        from passctl.ir import Shape, TensorType

        v.type = TensorType(v.type.dtype, Shape((2, 4)))
    with pytest.raises(TvmTranslationError, match=r"node '.*' \(op ConstantOfShape\): broadcast_to "
                                                  r"expects the input shape"):
        emit_tvm(model, tmp_path / "a")


def test_lower_tvm_fixes_dims_and_scalar_constant_of_shape(tmp_path):
    original = onnx.parser.parse_model(MASK)
    model = _model()
    result = LowerTvm(dims="batch=2")(model)
    assert result.stats["dims_fixed"] == 2
    assert [list(v.shape.dims) for v in model.graph.inputs] == [[2, 4], [2, 4]]
    ops = [n.op_type for n in model.graph]
    assert "ConstantOfShape" not in ops and "Shape" not in ops  # scalar constant; Shape folded
    emit_tvm(model, tmp_path / "a")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.uniform(-1, 1, (2, 4)).astype(np.float32),
             "m": rng.integers(0, 2, (2, 4)).astype(bool)}
    got = run_tvm(tmp_path / "a", feeds)["y"]
    want = run_ort(original, feeds)["y"]
    assert rel_err(got, want) == 0.0
    assert np.count_nonzero(got) == np.count_nonzero(feeds["m"])


def test_scalar_constant_of_shape_rule_alone():
    model = _model()
    result = LowerTvm()(model)  # no dims: rule 3 only
    assert result.stats == {"dims_fixed": 0, "scalar_constant_of_shape": 1}
    rng = np.random.default_rng(1)
    feeds = {"x": rng.uniform(-1, 1, (3, 4)).astype(np.float32),
             "m": rng.integers(0, 2, (3, 4)).astype(bool)}
    original = onnx.parser.parse_model(MASK)
    assert np.array_equal(run_ort(to_onnx(model), feeds)["y"], run_ort(original, feeds)["y"])


def test_parse_dims():
    assert parse_dims("batch=1, sequence=128;x[2]=7") == {"batch": 1, "sequence": 128, "x[2]": 7}
    with pytest.raises(UserError, match="dims item 'batch' is not NAME=SIZE"):
        parse_dims("batch")
    with pytest.raises(UserError, match="'seq=0'"):
        parse_dims("seq=0")
