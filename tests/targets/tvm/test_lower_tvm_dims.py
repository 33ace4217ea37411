"""lower-tvm dims: unknown names and '?' refused, input[axis] for unnamed dims, static axes checked."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from corpus import corpus_path
from tvm_helpers import rel_err, run_cli, run_ort, run_tvm

from passctl.ir import from_onnx
from passctl.ir.errors import UserError
from passctl.passes.lowering.lower_tvm import LowerTvm
from passctl.support.dims import parse_dims
from passctl.targets.tvm.frontend import check_static_inputs


def _proto(x_dims, y_dims) -> onnx.ModelProto:
    """y = x + b with a [4] bias; ``-1`` in ``x_dims`` is written as dim_value -1 (Paddle2ONNX)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 if d == -1 else d for d in x_dims])
    for i, d in enumerate(x_dims):
        if d == -1:
            x.type.tensor_type.shape.dim[i].dim_value = -1
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)
    b = helper.make_tensor("b", TensorProto.FLOAT, [4], [0.5, -1.0, 2.0, 0.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"], name="add")], "g",
                              [x], [y], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _paddle_like():
    """x[-1, '?', '?', 4]: every free dim unnamed, the way PP-OCR models declare them."""
    return from_onnx(_proto([-1, "?", "?", 4], [None, None, None, 4]))


def test_static_check_suggests_input_axis_for_unnamed_dims():
    with pytest.raises(UserError) as e:
        check_static_inputs(_paddle_like())
    message = str(e.value)
    assert "\n" not in message
    assert 'lower-tvm{dims="x[0]=SIZE,x[1]=SIZE,x[2]=SIZE"}' in message
    assert "?=SIZE" not in message
    named = from_onnx(_proto(["batch", "?", 4], ["batch", None, 4]))
    with pytest.raises(UserError, match=r'dims="batch=SIZE,x\[1\]=SIZE"'):
        check_static_inputs(named)


def test_question_mark_is_refused_as_a_dim_name():
    with pytest.raises(UserError, match=r"'\?' marks unnamed dims.*INPUT\[AXIS\]=SIZE") as e:
        parse_dims("x[0]=1,?=48")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="marks unnamed dims"):
        LowerTvm(dims="?=2")(_paddle_like())


def test_name_matching_no_dim_lists_names_and_input_axes():
    model = from_onnx(_proto(["n", "?", 4], ["n", None, 4]))
    with pytest.raises(UserError) as e:
        LowerTvm(dims="batch=1")(model)
    message = str(e.value)
    assert "\n" not in message
    assert "dims name 'batch' matches no dim" in message
    assert "symbolic dim names: n;" in message and "INPUT[AXIS]: x[0], x[1])" in message
    with pytest.raises(UserError, match="'y\\[0\\]' matches no dim"):  # an output, not an input
        LowerTvm(dims="y[0]=1")(model)
    with pytest.raises(UserError, match=r"'x\[3\]=1': input 'x' has rank 3, so its axes are 0..2"):
        LowerTvm(dims="x[3]=1")(model)
    assert model.graph.inputs[0].shape.dims == ("n", "?", 4)  # nothing changed


def test_static_axis_same_size_is_a_no_op_other_size_is_an_error():
    model = _paddle_like()
    result = LowerTvm(dims="x[3]=4")(model)
    assert result.stats["dims_fixed"] == 0
    assert model.graph.inputs[0].shape.dims == (None, "?", "?", 4)
    with pytest.raises(UserError, match=r"'x\[3\]=5': axis 3 of input 'x' is static with size 4; "
                                        r"drop the item or give x\[3\]=4"):
        LowerTvm(dims="x[3]=5")(model)


def test_unnamed_dims_get_their_own_sizes(tmp_path):
    proto = _proto([-1, "?", "?", 4], [None, None, None, 4])
    model = from_onnx(proto)
    result = LowerTvm(dims="x[0]=2,x[1]=3,x[2]=5")(model)
    assert result.stats["dims_fixed"] == 3
    assert model.graph.inputs[0].shape.dims == (2, 3, 5, 4)
    assert check_static_inputs(model) == {"x": ((2, 3, 5, 4), "float32")}


@pytest.mark.slow  # ~12 s: TVM build of PP-OCR's direction classifier
def test_ppocr_cls_with_unnamed_dims_compiles_end_to_end(tmp_path):
    path = corpus_path("ppocr_cls")
    out = tmp_path / "cls.tvm"
    r = run_cli(path, "--pipeline", 'cleanup,fuse,lower-tvm{dims="x[0]=1,x[2]=48,x[3]=192"}',
                "--target", "cpu", "--emit", "tvm", "-o", out, "-q", timeout=120)
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    want = run_ort(onnx.load(path), {"x": x})["save_infer_model/scale_0.tmp_1"]
    got = run_tvm(out, {"x": x})["save_infer_model/scale_0.tmp_1"]
    assert got.shape == (1, 2) and rel_err(got, want) < 1e-4
    assert np.isclose(float(want.sum()), 1.0, atol=1e-5)  # softmax over the two orientations
