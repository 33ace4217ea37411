"""Tests of passctl.support.check: inputs, ONNX Runtime runs and the comparison formulas."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from passctl.ir.errors import UserError
from passctl.support.check import (REL_FLOOR, check_models, compare, make_inputs, run_onnxruntime)


def _scale_model(factor: float, use_add: bool = False) -> onnx.ModelProto:
    """Y = X * factor (or X + X), X: float32 [batch, 4]."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 4])
    if use_add:
        nodes, inits = [helper.make_node("Add", ["X", "X"], ["Y"])], []
    else:
        nodes = [helper.make_node("Mul", ["X", "k"], ["Y"])]
        inits = [helper.make_tensor("k", TensorProto.FLOAT, [], [factor])]
    graph = helper.make_graph(nodes, "scale", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _bert_like_inputs_model() -> onnx.ModelProto:
    """A model whose inputs exercise every make_inputs rule; one initializer is also listed as input."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("image", TensorProto.FLOAT, [None, 3, None, "width"]),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, [5]),
        helper.make_tensor_value_info("half", TensorProto.FLOAT16, ["sequence"]),
        helper.make_tensor_value_info("steps", TensorProto.INT32, [2, 3]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [1]),
    ]
    outputs = [helper.make_tensor_value_info("out", TensorProto.INT64, None)]
    nodes = [helper.make_node("Identity", ["input_ids"], ["out"])]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])]
    graph = helper.make_graph(nodes, "inputs", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_make_inputs_rules_and_shapes():
    arrays = make_inputs(_bert_like_inputs_model(), seed=3)
    assert list(arrays) == ["input_ids", "attention_mask", "token_type_ids", "position_ids", "image",
                            "flag", "half", "steps"]  # the initializer "w" is not an input
    assert arrays["input_ids"].shape == (1, 16) and arrays["input_ids"].dtype == np.int64
    assert arrays["input_ids"].min() >= 0 and arrays["input_ids"].max() < 1000
    np.testing.assert_array_equal(arrays["attention_mask"], np.ones((1, 16), np.int64))
    np.testing.assert_array_equal(arrays["token_type_ids"], np.zeros((1, 16), np.int64))
    np.testing.assert_array_equal(arrays["position_ids"], np.arange(16, dtype=np.int64)[None, :])
    assert arrays["image"].shape == (1, 3, 32, 32) and arrays["image"].dtype == np.float32
    assert -1.0 <= arrays["image"].min() and arrays["image"].max() < 1.0
    assert arrays["flag"].dtype == np.bool_ and arrays["flag"].shape == (5,)
    assert arrays["half"].dtype == np.float16 and arrays["half"].shape == (16,)
    assert arrays["steps"].dtype == np.int32 and arrays["steps"].max() < 10


def test_make_inputs_is_seeded():
    model = _bert_like_inputs_model()
    first, again, other = make_inputs(model, seed=7), make_inputs(model, seed=7), make_inputs(model, seed=8)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["image"], other["image"])
    # Independently: the first draw of default_rng(7) is input_ids, integers in [0, 1000).
    expected_ids = np.random.default_rng(7).integers(0, 1000, size=(1, 16))
    np.testing.assert_array_equal(first["input_ids"], expected_ids)


def test_make_inputs_dim_values_and_overrides():
    model = _bert_like_inputs_model()
    arrays = make_inputs(model, dim_values={"sequence": 5, "image[2]": 48, "width": 64})
    assert arrays["input_ids"].shape == (1, 5) and arrays["half"].shape == (5,)
    assert arrays["image"].shape == (1, 3, 48, 64)
    ids = np.full((2, 7), 3, dtype=np.int64)
    arrays = make_inputs(model, overrides={"input_ids": ids})
    assert arrays["input_ids"] is not None and np.array_equal(arrays["input_ids"], ids)
    # The override binds batch=2 and sequence=7 for the other inputs sharing those names.
    assert arrays["attention_mask"].shape == (2, 7) and arrays["half"].shape == (7,)


def test_make_inputs_errors(tmp_path):
    with pytest.raises(UserError, match="name no graph input"):
        make_inputs(_bert_like_inputs_model(), overrides={"input_idz": np.zeros(1)})
    strings = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "g",
                                [helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
                                [helper.make_tensor_value_info("t", TensorProto.STRING, [1])])
    with pytest.raises(UserError, match="string"):
        make_inputs(helper.make_model(strings))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError, match="bad.onnx"):
        make_inputs(str(bad))


def test_run_onnxruntime_path_bytes_proto(tmp_path):
    model = _scale_model(2.5)
    path = tmp_path / "scale.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for source in (str(path), path, model.SerializeToString(), model):
        outputs = run_onnxruntime(source, {"X": x})
        assert list(outputs) == ["Y"]
        np.testing.assert_array_equal(outputs["Y"], x * np.float32(2.5))
    with pytest.raises(UserError, match="missing \\['X'\\]"):
        run_onnxruntime(model, {"Z": x})


def test_compare_formulas_against_numpy():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((4, 5)).astype(np.float32)
    cand = ref + rng.standard_normal((4, 5)).astype(np.float32) * 1e-3
    diff = compare({"y": ref}, {"y": cand}).outputs["y"]
    a, b = ref.astype(np.float64), cand.astype(np.float64)
    expected_abs = np.abs(a - b).max()
    assert diff.max_abs == pytest.approx(expected_abs, rel=1e-12)
    assert diff.max_rel == pytest.approx(expected_abs / np.abs(a).max(), rel=1e-12)
    expected_cos = (a * b).sum() / math.sqrt((a * a).sum() * (b * b).sum())
    assert diff.cosine == pytest.approx(expected_cos, rel=1e-12)
    assert diff.ok(rtol=1e-2) and not diff.ok(rtol=diff.max_rel / 2)


def test_compare_huge_magnitudes_uses_output_scale():
    ref = np.array([1e15, -3e14, 2.0], dtype=np.float32)
    cand = (ref.astype(np.float64) * (1 + 1e-6)).astype(np.float32)
    result = compare({"y": ref}, {"y": cand})
    diff = result.outputs["y"]
    assert diff.max_abs > 1e8  # large absolute error ...
    expected_rel = np.abs(ref.astype(np.float64) - cand).max() / 1e15
    assert diff.max_rel == pytest.approx(expected_rel, rel=1e-9)  # ... small relative one
    assert result.ok(rtol=1e-5) and diff.cosine == pytest.approx(1.0, abs=1e-9)


def test_compare_nan_and_inf():
    ref = np.array([1.0, np.nan, np.inf, 4.0], dtype=np.float32)
    same = compare({"y": ref}, {"y": ref.copy()})
    assert same.ok() and same.outputs["y"].max_abs == 0.0
    nan_moved = np.array([np.nan, 2.0, np.inf, 4.0], dtype=np.float32)
    result = compare({"y": ref}, {"y": nan_moved})
    assert result.outputs["y"].nonfinite_mismatch == 2 and not result.ok(rtol=1.0)
    assert result.max_rel == math.inf and "NaN/inf" in result.failures()[0]
    inf_sign = np.array([1.0, np.nan, -np.inf, 4.0], dtype=np.float32)
    assert compare({"y": ref}, {"y": inf_sign}).outputs["y"].nonfinite_mismatch == 1


def test_compare_zero_reference_uses_floor():
    zeros = np.zeros(3, np.float32)
    assert compare({"y": zeros}, {"y": zeros.copy()}).ok(rtol=0.0)
    diff = compare({"y": zeros}, {"y": np.array([0, 1e-6, 0], np.float32)}).outputs["y"]
    assert diff.max_rel == pytest.approx(np.float32(1e-6) / REL_FLOOR)
    assert diff.cosine == 0.0 and not diff.ok()


def test_compare_interface_problems():
    y = np.ones((2, 3), np.float32)
    result = compare({"y": y, "z": y}, {"y": y.reshape(3, 2), "w": y})
    assert "shape [3, 2]" in result.outputs["y"].problem
    assert result.outputs["z"].problem == "missing in the candidate"
    assert result.extra == ["w"] and not result.ok(rtol=1e9)
    dtype = compare({"y": y}, {"y": y.astype(np.float64)})
    assert "dtype float64" in dtype.outputs["y"].problem and not dtype.ok()
    ints = compare({"i": np.array([1, 2, 3])}, {"i": np.array([1, 2, 4])}).outputs["i"]
    assert ints.max_abs == 1.0 and ints.max_rel == pytest.approx(1 / 3)
    report = compare({"y": y}, {"y": y}).to_dict()
    assert report["ok"] is True and report["outputs"][0]["max_rel"] == 0.0


def test_check_models_passes_and_fails(tmp_path):
    reference = _scale_model(2.0)
    assert check_models(reference, _scale_model(0.0, use_add=True)).ok(rtol=0.0)
    path = tmp_path / "ref.onnx"
    onnx.save(reference, str(path))
    off = check_models(str(path), _scale_model(2.002), seed=5)
    # Independently: inputs from make_inputs(seed=5), error relative to max |2 x|.
    x = make_inputs(reference, seed=5)["X"]
    expected = np.abs(x * np.float32(2.0) - x * np.float32(2.002)).max() / np.abs(2.0 * x).max()
    assert off.outputs["Y"].max_rel == pytest.approx(expected, rel=1e-5)
    assert not off.ok(rtol=1e-4) and off.ok(rtol=2e-3)


def _relu_model() -> onnx.ModelProto:
    """y = Relu(x), x float [2]."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("optimize,level", [(False, "ORT_DISABLE_ALL"), (True, "ORT_ENABLE_ALL"),
                                            ("ORT_ENABLE_EXTENDED", "ORT_ENABLE_EXTENDED")])
def test_cpu_session_takes_a_session_json_level_name(optimize, level):
    import onnxruntime as ort

    from passctl.support.check import cpu_session

    model = _relu_model()
    session = cpu_session(model.SerializeToString(), optimize=optimize)
    assert session.get_session_options().graph_optimization_level == \
        getattr(ort.GraphOptimizationLevel, level)


@pytest.mark.parametrize("spinning,entry", [(None, None), (True, "1"), (False, "0")])
def test_cpu_session_sets_worker_spinning_only_when_asked(spinning, entry):
    from passctl.support.check import cpu_session

    model = _relu_model()
    session = cpu_session(model.SerializeToString(), threads=2, spinning=spinning)
    options = session.get_session_options()
    if entry is None:  # ONNX Runtime's default: no entry at all
        with pytest.raises(RuntimeError, match="allow_spinning"):
            options.get_session_config_entry("session.intra_op.allow_spinning")
    else:
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == entry
    x = np.array([-1.5, 2.0], np.float32)
    assert session.run(None, {"x": x})[0].tolist() == [0.0, 2.0]
