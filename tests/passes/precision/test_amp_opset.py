"""amp and the model's opset: an op gets fp16/bf16 only where its ONNX schema at that opset admits it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.defs
import onnx.helper as oh
import onnx.numpy_helper
import pytest

from amp_graphs import elem_types, run_amp
from passctl.ir import DataType, Node, TensorType, Value, from_onnx
from passctl.passes.common import InferShapes
from passctl.passes.precision import rule_fp32_nodes
from passctl.passes.precision.cpu_kernels import ort_cpu_loads
from passctl.passes.precision.ops import COMPUTE_OPS, EXACT_OPS, schema_refusal
from passctl.tools.cli import main

CONV11_NO_BF16 = "Conv-11 has no bfloat16 (from opset 22)"


def conv_model(opset: int) -> onnx.ModelProto:
    """``y = Relu(Conv(x, w, b))``, x: [1, 3, 16, 16] float32, w: [8, 3, 3, 3], pads 1, at ``opset``."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
    graph = oh.make_graph(
        [oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["c"], ["y"])],
        "conv", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16, 16])], [w, b])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def _compile(tmp_path, capsys, opset: int, pipeline: str):
    src = tmp_path / f"conv{opset}.onnx"
    onnx.save(conv_model(opset), str(src))
    out = tmp_path / "out"
    capsys.readouterr()
    rc = main([str(src), "--pipeline", pipeline, "--target", "a10", "-o", str(out), "--check"])
    text = "".join(capsys.readouterr())
    report = json.loads((out / "report.json").read_text()) if rc == 0 else None
    return rc, text, report, out


def _amp_nodes(report):
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "mixed-precision")
    return stats, {n["op"]: n for n in stats["nodes"]}


def test_conv_opset17_bf16_stays_float32_and_checks(tmp_path, capsys):
    rc, text, report, out = _compile(tmp_path, capsys, 17, "amp{dtype=bf16,budget=0.02}")
    assert rc == 0, text  # was rc 3: ORT refused Conv with a tensor(bfloat16) input at opset 17
    stats, nodes = _amp_nodes(report)
    assert nodes["Conv"]["precision"] == "fp32" and CONV11_NO_BF16 in nodes["Conv"]["why"]
    assert nodes["Relu"]["precision"] == "fp32" and stats["low_nodes"] == 0
    # the check compares ONNX Runtime on the original with the artifact, within the budget
    assert report["check"]["ok"] and report["check"]["metric_error"] <= 0.02
    emitted = onnx.load(str(out / "model.onnx"))
    assert not any(i.data_type == onnx.TensorProto.BFLOAT16 for i in emitted.graph.initializer)
    onnx.shape_inference.infer_shapes(emitted, strict_mode=True)


def test_conv_opset22_bf16_is_typed_and_ort_cpu_has_no_kernel():
    proto, stats = run_amp(conv_model(22), "amp{dtype=bf16,budget=0.02,samples=1}", "a10")
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    types = elem_types(proto, strict=True)  # Conv-22 admits bfloat16: strict inference accepts it
    assert [types[i] for i in conv.input] == [onnx.TensorProto.BFLOAT16] * 3
    assert {n["op"]: n["precision"] for n in stats["nodes"]} == {"Conv": "bf16", "Relu": "bf16"}
    # What is true with the installed ONNX Runtime (1.32): its CPU EP has no bf16 Conv-22 kernel, so
    # the probe makes the cpu policy emulate it (float32 compute behind Casts).
    model = from_onnx(proto)
    node = next(n for n in model.graph if n.op_type == "Conv")
    assert ort_cpu_loads(node, 22) is False


def test_conv_opset22_bf16_emulated_checks_against_the_original(tmp_path, capsys):
    rc, text, report, _ = _compile(tmp_path, capsys, 22, "amp{dtype=bf16,budget=0.02,emulate=true}")
    assert rc == 0, text
    stats, nodes = _amp_nodes(report)
    assert nodes["Conv"]["precision"] == "bf16" and stats["emulated_nodes"] >= 1
    assert report["check"]["ok"] and 0 < report["check"]["metric_error"] <= 0.02  # bf16 rounding shows


def _node(op_type: str, n_inputs: int, dtype: DataType = DataType.FLOAT, domain: str = "") -> Node:
    ins = [Value(f"i{k}", TensorType(dtype, None)) for k in range(n_inputs)]
    return Node(domain, op_type, ins, [], [Value("o", TensorType(dtype, None))])


@pytest.mark.parametrize("op_type,n,opset,low,expected", [
    ("Conv", 3, 17, DataType.BFLOAT16, CONV11_NO_BF16),
    ("Conv", 3, 22, DataType.BFLOAT16, None),
    ("Conv", 3, 17, DataType.FLOAT16, None),
    ("MaxPool", 1, 18, DataType.BFLOAT16, "MaxPool-12 has no bfloat16 (from opset 22)"),
    ("Sin", 1, 17, DataType.BFLOAT16, "Sin-7 has no bfloat16 (from opset 22)"),
    ("LeakyRelu", 1, 15, DataType.BFLOAT16, "LeakyRelu-6 has no bfloat16 (from opset 16)"),
    ("MatMul", 2, 13, DataType.BFLOAT16, None),
    ("Add", 2, 12, DataType.BFLOAT16, "Add-7 has no bfloat16 (from opset 13)"),
])
def test_schema_refusal(op_type, n, opset, low, expected):
    assert schema_refusal(_node(op_type, n), opset, low) == expected


def test_contrib_and_ort_default_domain_ops_are_not_judged_by_onnx_schemas():
    assert schema_refusal(_node("FusedConv", 3, domain="com.microsoft"), 17, DataType.BFLOAT16) is None
    assert schema_refusal(_node("SimplifiedLayerNormalization", 2), 17, DataType.BFLOAT16) is None


def test_fp16_never_depends_on_the_opset_for_listed_ops():
    """Every op amp lists admits float16 for its typed inputs at every opset where its schema exists
    (measured over onnx's schemas: only bfloat16 was added later, to Conv, pools, Sin, ...)."""
    for op_type in (*COMPUTE_OPS, *EXACT_OPS):
        for opset in range(7, onnx.defs.onnx_opset_version() + 1):
            node = _node(op_type, 3)
            assert schema_refusal(node, opset, DataType.FLOAT16) is None, (op_type, opset)


def test_rule_reason_and_no_opset_keeps_old_behaviour():
    model = from_onnx(conv_model(17))
    InferShapes().run(model)
    graph = model.graph
    conv = next(n for n in graph if n.op_type == "Conv")
    assert CONV11_NO_BF16 in rule_fp32_nodes(graph, DataType.BFLOAT16, opset=17)[conv]
    assert conv not in rule_fp32_nodes(graph, DataType.BFLOAT16)
    assert conv not in rule_fp32_nodes(graph, DataType.FLOAT16, opset=17)
