"""fold-constants evaluates with ONNX Runtime (cases 08, 14 of issue 15): ops where onnx.reference
differs from ONNX Runtime fold to ONNX Runtime's values, the onnx.reference allow-list matches ONNX
Runtime op by op, and low-bit weights are never folded into larger float constants."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest
from helpers import apply, op_types
from onnx import TensorProto as TP
from onnx.reference import ReferenceEvaluator

import passctl.passes.common.fold_constants as fold_module
from passctl.passes.common.fold_constants import REFERENCE_OPS, FoldConstants
from passctl.support.check import run_onnxruntime

CASES = Path(__file__).resolve().parents[2] / "cases"


def _inits(proto):
    return {t.name: nh.to_array(t) for t in proto.graph.initializer}


def _ort_outputs(proto, feeds):
    """ONNX Runtime's outputs of ``proto`` at ORT_DISABLE_ALL (the check's reference level)."""
    return run_onnxruntime(proto, feeds)


def _weight_model(op, attrs, weights, opset=17, out_shape=None):
    """``y = Add(x, op(*weights))``: op's inputs all constant, so fold-constants evaluates it."""
    names = [f"w{i}" for i in range(len(weights))]
    ref = ReferenceEvaluator(oh.make_model(
        oh.make_graph([oh.make_node(op, names, ["c"], **attrs)], "probe", [],
                      [onnx.ValueInfoProto(name="c")],
                      [nh.from_array(w, n) for w, n in zip(weights, names)]),
        opset_imports=[oh.make_opsetid("", opset)])).run(None, {})[0]
    shape = list(out_shape or ref.shape)
    nodes = [oh.make_node(op, names, ["c"], **attrs), oh.make_node("Add", ["x", "c"], ["y"])]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TP.FLOAT, shape)],
                          [oh.make_tensor_value_info("y", TP.FLOAT, shape)],
                          [nh.from_array(w, n) for w, n in zip(weights, names)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8
    return model, shape


def test_case_08_lpnormalization_p1_folds_to_onnxruntime_values():
    """onnx.reference computes LpNormalization p=1 as w / sum(w) (no abs): the fold must give
    ONNX Runtime's w / sum(|w|), the value the unfolded model computes."""
    proto = onnx.load(str(CASES / "08-fold-constants-onnx-reference" / "model.onnx"))
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 1 and op_types(out) == ["MatMul"]
    w = nh.to_array(proto.graph.initializer[0]).astype(np.float64)
    folded = _inits(out)["wn"]
    # independent value: the ONNX spec's L1 norm, sum |w| along the last axis (numpy, float64)
    np.testing.assert_allclose(folded, w / np.abs(w).sum(axis=-1, keepdims=True), rtol=1e-6)
    x = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32)
    want, got = _ort_outputs(proto, {"x": x})["y"], _ort_outputs(out, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


_RNG = np.random.default_rng(1)
_W = (_RNG.normal(size=(3, 4)) * 3).astype(np.float32)
KNOWN_TO_DIFFER_OR_EDGY = [
    ("LpNormalization", {"p": 1, "axis": -1}, [_W]),  # onnx.reference: no abs (differs)
    ("LpNormalization", {"p": 2, "axis": 0}, [_W]),
    ("Resize", {"mode": "cubic"}, [_W.reshape(1, 1, 3, 4), np.array([], np.float32),
                                   np.array([1, 1, 2, 2], np.float32)]),
    ("Mod", {"fmod": 1}, [_W, np.full((3, 4), 1.5, np.float32)]),
    ("Round", {}, [np.array([0.5, 1.5, 2.5, -0.5], np.float32)]),
    ("Pow", {}, [_W, np.array(2.0001, np.float32)]),
    ("Gelu", {"approximate": "tanh"}, [_W]),
]


@pytest.mark.parametrize("op,attrs,weights", KNOWN_TO_DIFFER_OR_EDGY,
                         ids=[f"{c[0]}{i}" for i, c in enumerate(KNOWN_TO_DIFFER_OR_EDGY)])
def test_folded_value_is_what_onnxruntime_computes(op, attrs, weights):
    """Folded or not, the model gives ONNX Runtime's own result of the unfolded graph, bit for bit
    (the fold ran the same kernel)."""
    opset = 20 if op == "Gelu" else 17
    proto, shape = _weight_model(op, attrs, weights, opset)
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 1, result.stats
    x = np.zeros(shape, np.float32)
    want, got = _ort_outputs(proto, {"x": x})["y"], _ort_outputs(out, {"x": x})["y"]
    np.testing.assert_array_equal(got, want)


_A = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5
_I = np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 7
REFERENCE_CASES = {
    "Identity": [({}, [_A]), ({}, [_I])],
    "Reshape": [({}, [_A, np.array([4, -1], np.int64)]), ({"allowzero": 0}, [_I, np.array([0, 12], np.int64)])],
    "Squeeze": [({}, [_A.reshape(2, 1, 12), np.array([1], np.int64)])],
    "Unsqueeze": [({}, [_I, np.array([0, -1], np.int64)])],
    "Flatten": [({"axis": 2}, [_A]), ({"axis": -1}, [_I])],
    "Transpose": [({"perm": [2, 0, 1]}, [_A]), ({}, [_I])],
    "Concat": [({"axis": -1}, [_A, _A]), ({"axis": 0}, [_I, _I])],
    "Split": [({"axis": 2, "num_outputs": 2}, [_A]), ({"axis": 1}, [_I, np.array([1, 2], np.int64)])],
    "Slice": [({}, [_A, np.array([0, -1], np.int64), np.array([2, -4], np.int64),
                    np.array([0, 2], np.int64), np.array([1, -1], np.int64)])],
    "Gather": [({"axis": 1}, [_A, np.array([[2, -1]], np.int64)]), ({}, [_I, np.array(-1, np.int64)])],
    "Expand": [({}, [_A[:, :1], np.array([2, 1, 3, 4], np.int64)])],
    "Tile": [({}, [_I, np.array([1, 2, 1], np.int64)])],
    "ConstantOfShape": [({"value": nh.from_array(np.array([7], np.int64))}, [np.array([2, 3], np.int64)]),
                        ({}, [np.array([3], np.int64)])],
    "Shape": [({"start": 1}, [_A]), ({"end": -1}, [_I])],
    "Size": [({}, [_A])],
}


def test_every_reference_op_is_tested():
    assert set(REFERENCE_CASES) == set(REFERENCE_OPS)


@pytest.mark.parametrize("op", sorted(REFERENCE_CASES))
def test_reference_allow_list_matches_onnxruntime(op):
    """An op may be folded by onnx.reference (where ONNX Runtime lacks a kernel) only if it gives
    ONNX Runtime's result: same dtype, shape and values."""
    for attrs, ins in REFERENCE_CASES[op]:
        names = [f"i{k}" for k in range(len(ins))]
        outs = ["o0", "o1"] if op == "Split" else ["o0"]
        graph = oh.make_graph([oh.make_node(op, names, outs, **attrs)], "g", [],
                              [onnx.ValueInfoProto(name=n) for n in outs],
                              [nh.from_array(a, n) for a, n in zip(ins, names)])
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
        model.ir_version = 8
        ref = ReferenceEvaluator(model).run(None, {})
        ort = list(run_onnxruntime(model, {}).values())
        for r, o in zip(ref, ort):
            assert np.asarray(r).dtype == o.dtype and np.asarray(r).shape == o.shape, (op, attrs)
            np.testing.assert_array_equal(np.asarray(r), o)


def test_reference_used_only_for_allow_listed_ops_when_onnxruntime_fails(monkeypatch):
    """Where ONNX Runtime cannot run the one-node model, an allow-listed op (Transpose) is folded
    by onnx.reference and any other op (LpNormalization) is kept."""
    def no_kernel(proto):
        raise RuntimeError("NOT_IMPLEMENTED: no kernel")

    monkeypatch.setattr(fold_module, "_run_ort", no_kernel)
    proto, _ = _weight_model("Transpose", {"perm": [1, 0]}, [_W])
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 1
    np.testing.assert_array_equal(_inits(out)["c"], _W.T)
    proto, _ = _weight_model("LpNormalization", {"p": 1, "axis": -1}, [_W])
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 0 and result.stats["failed"] == 1
    assert op_types(out) == ["LpNormalization", "Add"]


# -- low-bit weights (case 14) ------------------------------------------------------------------


def test_case_14_int8_cast_mul_not_blown_up(tmp_path):
    """Cast(int8 -> float) -> Mul(scale) -> MatMul stays int8: the saved model is about the input's
    size (not 4x), and its outputs equal ONNX Runtime's on the original."""
    src = CASES / "14-int8-castmul-folded" / "model.onnx"
    proto = onnx.load(str(src))
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["low_bit_kept"] == 1 and result.stats["folded"] == 0
    path = tmp_path / "model.onnx"
    onnx.save(out, str(path))
    assert os.path.getsize(path) < 1.05 * os.path.getsize(src)
    dtypes = {t.name: t.data_type for t in out.graph.initializer}
    assert TP.INT8 in dtypes.values() and all(
        t.data_type != TP.FLOAT or np.prod(t.dims) < 1000 for t in out.graph.initializer)
    x = np.random.default_rng(0).normal(size=(2, 384)).astype(np.float32)
    np.testing.assert_array_equal(_ort_outputs(out, {"x": x})["y"], _ort_outputs(proto, {"x": x})["y"])


def _dequant_model(text_nodes, q, extra):
    """``y = MatMul(x, W)`` where W is computed from the low-bit initializer ``q`` by ``text_nodes``."""
    nodes = [oh.make_node(*n[:3], **(n[3] if len(n) > 3 else {})) for n in text_nodes]
    nodes.append(oh.make_node("MatMul", ["x", "W"], ["y"]))
    inits = [nh.from_array(q, "q")] + [nh.from_array(v, k) for k, v in extra.items()]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", TP.FLOAT, [2, q.shape[0]])],
                          [oh.make_tensor_value_info("y", TP.FLOAT, [2, q.shape[-1]])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)])
    model.ir_version = 10
    return model


_Q = np.random.default_rng(2).integers(-128, 128, size=(64, 32)).astype(np.int8)
_U = np.random.default_rng(3).integers(0, 256, size=(64, 32)).astype(np.uint8)
SPELLINGS = {
    "cast_mul": ([("Cast", ["q"], ["f"], {"to": TP.FLOAT}), ("Mul", ["f", "s"], ["W"])], _Q,
                 {"s": np.full((1, 32), 0.02, np.float32)}),
    "cast_sub_mul_uint8": ([("Cast", ["q"], ["f"], {"to": TP.FLOAT}), ("Sub", ["f", "zp"], ["c"]),
                            ("Mul", ["c", "s"], ["W"])], _U,
                           {"zp": np.array(128, np.float32), "s": np.array(0.01, np.float32)}),
    "int_sub_then_cast": ([("Cast", ["q"], ["i"], {"to": TP.INT32}), ("Sub", ["i", "zp"], ["d"]),
                           ("Cast", ["d"], ["f"], {"to": TP.FLOAT}), ("Mul", ["f", "s"], ["W"])], _U,
                          {"zp": np.array(128, np.int32), "s": np.array(0.01, np.float32)}),
    "transpose_then_cast": ([("Transpose", ["q"], ["t"], {"perm": [1, 0]}),
                             ("Transpose", ["t"], ["t2"], {"perm": [1, 0]}),
                             ("Cast", ["t2"], ["f"], {"to": TP.FLOAT}), ("Mul", ["f", "s"], ["W"])],
                            _Q, {"s": np.array(0.02, np.float32)}),
    "dequantize_linear": ([("DequantizeLinear", ["q", "s"], ["W"], {"axis": 1})], _Q,
                          {"s": np.full(32, 0.02, np.float32)}),
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_low_bit_dequantization_never_folded_to_float(name):
    """However the dequantization is spelled, no float (or wider integer) copy of the weights is
    made: the largest initializer stays the low-bit one; the outputs equal ONNX Runtime's."""
    nodes, q, extra = SPELLINGS[name]
    proto = _dequant_model(nodes, q, extra)
    _, result, out = apply(proto, FoldConstants())
    read = {i for n in out.graph.node for i in n.input}  # (fold-constants leaves dead ones to dce)
    used = [t for t in out.graph.initializer if t.name in read]
    biggest = max(used, key=lambda t: nh.to_array(t).nbytes)
    assert biggest.data_type in (TP.INT8, TP.UINT8), (name, result.stats)
    assert sum(nh.to_array(t).nbytes for t in used) <= q.nbytes + 1024
    x = np.random.default_rng(0).normal(size=(2, q.shape[0])).astype(np.float32)
    np.testing.assert_array_equal(_ort_outputs(out, {"x": x})["y"], _ort_outputs(proto, {"x": x})["y"])


def test_low_bit_results_no_larger_than_their_data_are_folded():
    """Data movement of int8 weights (same bytes) and small float results computed from them
    (a scale from max |q|) still fold."""
    nodes = [("Transpose", ["q"], ["t"], {"perm": [1, 0]}), ("Transpose", ["t"], ["qq"], {"perm": [1, 0]}),
             ("ReduceMax", ["qq"], ["m"], {"keepdims": 0}), ("Cast", ["m"], ["mf"], {"to": TP.FLOAT}),
             ("DequantizeLinear", ["qq", "mf"], ["W"])]
    proto = _dequant_model(nodes, _Q, {})
    _, result, out = apply(proto, FoldConstants())
    assert result.stats["folded"] == 4 and result.stats["low_bit_kept"] == 0, result.stats
    assert op_types(out) == ["DequantizeLinear", "MatMul"]
    np.testing.assert_array_equal(_inits(out)["qq"], _Q)
    assert float(_inits(out)["mf"]) == float(_Q.max())
    x = np.random.default_rng(0).normal(size=(2, 64)).astype(np.float32)
    np.testing.assert_array_equal(_ort_outputs(out, {"x": x})["y"], _ort_outputs(proto, {"x": x})["y"])


def test_fold_dequantize_allows_the_float_copy():
    nodes, q, extra = SPELLINGS["cast_mul"]
    _, result, out = apply(_dequant_model(nodes, q, extra), FoldConstants(fold_dequantize=True))
    assert result.stats["folded"] == 2 and op_types(out) == ["MatMul"]
    np.testing.assert_allclose(_inits(out)["W"], q.astype(np.float32) * np.float32(0.02), rtol=1e-7)
