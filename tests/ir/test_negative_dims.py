"""A negative ONNX dim_value (Paddle2ONNX's -1) is an unknown dim; the verifier flags negative IR dims."""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper

from corpus import package_file
from passctl.ir import Shape, TensorType, from_onnx, print_model, to_onnx
from passctl.ir.verifier import TYPE, verify
from passctl.support.check import run_onnxruntime


def _relu_model() -> onnx.ModelProto:
    """Relu on x[-1, 3] -> y[-1, 3], the way Paddle2ONNX declares a free batch axis."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3])
    for vi in (x, y):
        vi.type.tensor_type.shape.dim[0].dim_value = -1
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_negative_dim_value_imports_as_unknown_and_exports_unset(tmp_path):
    proto = _relu_model()
    model = from_onnx(proto)
    assert model.graph.inputs[0].shape.dims == (None, 3)
    assert model.graph.outputs[0].shape.dims == (None, 3)
    assert "%x: f32[?,3]" in print_model(model)
    exported = to_onnx(model)
    dim = exported.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.WhichOneof("value") is None  # unknown: neither dim_value nor dim_param
    assert exported.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 3
    onnx.checker.check_model(exported, full_check=True)
    path = str(tmp_path / "relu.onnx")
    onnx.save(exported, path)
    x = np.random.default_rng(0).uniform(-1, 1, (7, 3)).astype(np.float32)
    got = run_onnxruntime(path, {"x": x})["y"]
    assert np.array_equal(got, np.maximum(x, 0))  # any batch size runs


def test_shipped_paddle_cls_model_input_is_unknown_not_minus_one():
    path = package_file("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    proto = onnx.load(path, load_external_data=False)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1  # as shipped
    model = from_onnx(proto, os.path.dirname(path))
    assert model.graph.inputs[0].shape.dims == (None, 3, "?", "?")
    assert '%x: f32[?,3,"?","?"]' in print_model(model)
    assert not [d for d in verify(model, check_output_types=False) if d.kind == TYPE]


def test_verifier_flags_a_negative_ir_dim():
    model = from_onnx(_relu_model())
    assert not [d for d in verify(model, check_output_types=False) if d.severity == "error"]
    model.graph.outputs[0].type = TensorType(model.graph.outputs[0].dtype, Shape((-1, 3)))
    diags = [d for d in verify(model, check_output_types=False) if d.severity == "error"]
    assert [d.kind for d in diags] == [TYPE]
    assert "value '%y' has a negative dim -1 in its shape [-1, 3]" in diags[0].message
    assert diags[0].node is model.graph.nodes[0]
