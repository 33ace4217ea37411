"""infer-shapes: data propagation, precision-keeping merge, custom domains, file-based path, conflicts."""

from __future__ import annotations

import logging

import onnx
from helpers import apply, assert_same_outputs, parse

from corpus import CORPUS
from passctl.ir import DataType, Shape, TensorType, from_onnx, load, to_onnx
from passctl.passes.common.infer_shapes import InferShapes, merge_types

# r = Reshape(x, [x.shape[0], -1]) through Shape -> Gather -> Concat
_RESHAPE_TO_BATCH = """
        s = Shape (x)
        i0 = Constant <value = int64[1] {0}> ()
        d0 = Gather <axis = 0> (s, i0)
        m1 = Constant <value = int64[1] {-1}> ()
        t = Concat <axis = 0> (d0, m1)
        r = Reshape (x, t)"""

_DYNAMIC_RESHAPE = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3,4] x) => (float[?,?] y) {""" + _RESHAPE_TO_BATCH + """
        y = Relu (r)
    }"""


def _values(model):
    return {v.name: v for n in model.graph.all_nodes() for v in n.outputs}


def test_data_propagation_gives_static_shapes():
    proto = parse(_DYNAMIC_RESHAPE)
    model, result, out = apply(proto, InferShapes())
    values = _values(model)
    # Shape -> Gather -> Concat is propagated as data, so the Reshape target [2, -1] is known.
    assert values["t"].type == TensorType(DataType.INT64, Shape((2,)))
    assert values["r"].type == TensorType(DataType.FLOAT, Shape((2, 12)))
    assert values["y"].type == TensorType(DataType.FLOAT, Shape((2, 12)))
    assert result.stats["untyped"] == 0 and result.stats["inference_failed"] == 0
    assert result.stats["values_typed"] == 7  # six node outputs and the refined graph output y
    assert_same_outputs(proto, out)


def test_without_data_prop_reshape_stays_unknown():
    model, result, _ = apply(parse(_DYNAMIC_RESHAPE), InferShapes(data_prop=False))
    assert _values(model)["r"].type.shape.dims == (None, None)


def test_file_based_inference_for_large_models_matches():
    small, _, _ = apply(parse(_DYNAMIC_RESHAPE), InferShapes())
    large, result, _ = apply(parse(_DYNAMIC_RESHAPE), InferShapes(large_model_bytes=0))
    assert result.stats["values_typed"] == 7
    assert {k: v.type for k, v in _values(small).items()} == \
        {k: v.type for k, v in _values(large).items()}


def test_merge_never_loses_precision():
    f = DataType.FLOAT
    t = lambda *dims: TensorType(f, Shape(dims))  # noqa: E731
    assert merge_types(None, t(2, 3)) == (t(2, 3), False)
    assert merge_types(t("N", None), t(4, "M")) == (t(4, "M"), False)
    assert merge_types(t(4, 5), t("N", None)) == (None, False)  # existing ints stay
    # A conflict proves the declaration wrong: the inferred type replaces it.
    assert merge_types(t(4, 5), t(4, 6)) == (t(4, 6), True)  # two ints differ
    assert merge_types(t(4, 5), t(None, 6)) == (t(4, 6), True)  # an uncontradicted dim stays
    assert merge_types(t(4), t(4, 1)) == (t(4, 1), True)
    assert merge_types(TensorType(DataType.INT64, Shape((4,))), t(4)) == (t(4), True)
    assert merge_types(TensorType(f), t(1, 2)) == (t(1, 2), False)


def test_custom_domain_node_does_not_stop_inference():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
        g (float[2,3] x) => (float[2,3] y, float[3,2] z) {
            c = com.example.Mystery (x)
            y = Relu (c)
            z = Transpose (x)
        }""", check=False)
    model = from_onnx(proto)
    result = InferShapes()(model)
    values = _values(model)
    assert result.stats["inference_failed"] == 0
    assert values["c"].type is None  # no schema for com.example::Mystery
    assert values["z"].type == TensorType(DataType.FLOAT, Shape((3, 2)))
    assert values["y"].type == TensorType(DataType.FLOAT, Shape((2, 3)))  # declared, kept


def test_declared_output_shape_conflict_is_replaced_with_a_warning(caplog):
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[5,5] y) { y = Relu (x) }""", check=False)
    model = from_onnx(proto)
    with caplog.at_level(logging.WARNING, logger="passctl.passes.common.infer_shapes"):
        result = InferShapes()(model)
    assert result.stats["conflicts"] == 1 and result.stats["inference_failed"] == 0
    assert model.graph.outputs[0].type == TensorType(DataType.FLOAT, Shape((2, 3)))
    assert "'y' is declared f32[5,5] but computes f32[2,3]" in caplog.text


def test_case_09_stale_value_info_is_replaced_and_the_reshape_kept():
    """Case 09-stale-value-info-reshape-removed: r is declared [3,2] but Relu(x[2,3]) is [2,3];
    cleanup must keep Reshape(r, [3,2]) and the artifact return y of shape [3,2], as ORT on the
    original does."""
    from pathlib import Path

    from helpers import assert_same_outputs

    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline
    from passctl.support.check import run_onnxruntime
    from passctl.support.inputs import make_inputs

    path = Path(__file__).resolve().parents[1] / "cases" / "09-stale-value-info-reshape-removed" / "model.onnx"
    proto = onnx.load(path)
    model = from_onnx(proto)
    result = PassManager(build_pipeline("cleanup")).run(model)
    infer = next(r for r in result.records if r.name == "infer-shapes")
    assert infer.stats["conflicts"] == 1
    assert _values(model)["r"].type == TensorType(DataType.FLOAT, Shape((2, 3)))
    out = to_onnx(model)
    assert [n.op_type for n in out.graph.node] == ["Relu", "Reshape"]
    feeds = make_inputs(proto, seed=0)
    assert run_onnxruntime(out, feeds)["y"].shape == run_onnxruntime(proto, feeds)["y"].shape == (3, 2)
    assert_same_outputs(proto, out)


def test_real_model_fully_typed():
    model = load(CORPUS["ppocr_cls"].path)
    result = InferShapes()(model)
    assert result.stats["untyped"] == 0 and result.stats["values_typed"] > 500
    conv = next(n for n in model.graph if n.op_type == "Conv")
    weight = next(n for n in model.graph if n.outputs[0] is conv.inputs[1])  # a Constant node
    c_out = weight.attr("value").dims[0]
    out = conv.outputs[0].type
    assert out.dtype == DataType.FLOAT and out.shape.rank == 4 and out.shape[1] == c_out


_BATCH_RESHAPE = """
    <ir_version: 7, opset_import: ["" : 11]>
    g (float[?,2,4] x) => (float[?,?] y) {""" + _RESHAPE_TO_BATCH + """
        w = Constant <value = float[8,3] {1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24}> ()
        y = MatMul (r, w)
    }"""


def test_reshape_to_a_dynamic_shape_gets_its_rank():
    """Reshape (opset 11, as Paddle2ONNX writes) to Shape -> Gather -> Concat of an unknown
    batch (Paddle exports' -1): onnx types neither the Reshape nor its MatMul consumer;
    infer-shapes gives the Reshape the rank of its shape input (2, Reshape spec) and a second
    onnx round types the MatMul [?, 3]."""
    import onnx.shape_inference

    proto = parse(_BATCH_RESHAPE)
    alone = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(proto, data_prop=True)
             .graph.value_info}
    assert not alone["r"].type.tensor_type.HasField("shape")  # what onnx gives by itself
    model, result, out = apply(proto, InferShapes())
    values = _values(model)
    assert values["r"].type.shape.rank == 2 and values["r"].type.shape.dims[1] is None
    assert values["y"].type.dtype == DataType.FLOAT and values["y"].type.shape.rank == 2
    assert values["y"].type.shape.dims[1] == 3
    assert result.stats["untyped"] == 0
    assert_same_outputs(proto, out)
