"""lower-onnxruntime / lower-standard: every canonical op has both forms, fallbacks, dynamic shapes."""

from __future__ import annotations

import logging

import onnx

import numpy as np
from fusion_helpers import model_text, ops, run
from helpers import assert_same_outputs

from passctl.ir import Builder, from_onnx, to_onnx
from passctl.dialect.canonical import SCHEMAS, canonical_op_doc
from passctl.passes.lowering.table import _TABLES
from passctl.passes.registry import expand_alias, get_pass

LN_NO_SCALE = ("m = ReduceMean <axes=[-1]> (x)\nd = Sub (x, m)\np = Mul (d, d)\nv = ReduceMean <axes=[-1]> (p)\n"
               "e = Constant <value = float {1e-5}> ()\nve = Add (v, e)\ns = Sqrt (ve)\ny = Div (d, s)")


def test_every_canonical_op_has_both_lowerings_and_a_documented_schema():
    get_pass("lower-onnxruntime")  # loads the built-in passes
    for op in SCHEMAS:
        assert _TABLES["onnxruntime"].get(op) and _TABLES["standard"].get(op), op
        assert f"passctl::{op}(" in canonical_op_doc()


def test_layernorm_without_scale_and_dynamic_last_dim_gets_run_time_ones():
    proto = model_text(LN_NO_SCALE, "float[2,4,D] x", "float[2,4,D] y", 17)
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 4, 8)).astype(np.float32)}
    for lowering in ("lower-onnxruntime", "lower-standard"):
        _, stats, out = run(proto, f"infer-shapes,fuse-layernorm,dce,{lowering}")
        assert stats["fuse-layernorm"]["layernorm"] == 1
        assert ops(out) == ["Shape", "Slice", "ConstantOfShape", "LayerNormalization"]
        assert_same_outputs(proto, out, inputs=feeds, rtol=1e-5)


def test_layernorm_below_opset_17_is_decomposed_for_standard_and_kept_fused_for_ort():
    proto = model_text(LN_NO_SCALE, "float[2,4,8] x", "float[2,4,8] y", 13)
    _, _, ort = run(proto, "infer-shapes,fuse-layernorm,dce,lower-onnxruntime")
    _, _, std = run(proto, "infer-shapes,fuse-layernorm,dce,lower-standard")
    assert ops(ort) == ["LayerNormalization"]  # ONNX Runtime registers it below 17 too
    assert ops(std) == ["ReduceMean", "Sub", "Mul", "ReduceMean", "Add", "Sqrt", "Div"]
    assert_same_outputs(proto, ort, rtol=1e-5)
    assert_same_outputs(proto, std, rtol=1e-5)


def test_skip_layernorm_of_rank_4_falls_back_to_add_and_layernorm_for_ort():
    body = "s = Add (a, r)\ny = LayerNormalization <axis=-1, epsilon=1e-5> (s, W)"
    proto = model_text(body, "float[2,3,4,8] a, float[2,3,4,8] r", "float[2,3,4,8] y", 17,
                       {"W": np.random.default_rng(2).standard_normal(8).astype(np.float32)})
    _, stats, out = run(proto, "infer-shapes,fuse-layernorm,lower-onnxruntime")
    assert stats["fuse-layernorm"]["skip_layernorm"] == 1
    assert stats["lower-onnxruntime"]["SkipLayerNorm->Add+LayerNormalization"] == 1
    assert ops(out) == ["Add", "LayerNormalization"]
    assert_same_outputs(proto, out, rtol=1e-5)


def test_unknown_canonical_op_is_counted_and_kept(caplog):
    proto = model_text("y = Relu (x)", "float[4] x", "float[4] y", 17)
    model = from_onnx(proto)
    relu = next(iter(model.graph))
    out = Builder(model.graph, before=relu).op("NotAnOp", relu.inputs[0], domain="passctl")
    relu.set_input(0, out)
    model.opset_imports["passctl"] = 1
    with caplog.at_level(logging.WARNING):
        result = get_pass("lower-onnxruntime")()(model)
    assert result.stats["unlowered"] == 1 and not result.modified
    assert "no onnxruntime form for passctl::NotAnOp" in caplog.text
    assert model.opset_imports.get("passctl") == 1
    assert "passctl" in {o.domain for o in to_onnx(model).opset_import}


def test_fuse_alias_order_per_target():
    mine = ["fuse-layernorm", "fuse-gelu", "fuse-activations"]
    for target, lowering in [("cpu", "lower-onnxruntime"), ("a10", "lower-onnxruntime"),
                             ("tvm", "lower-standard"), ("tensorrt", "lower-standard")]:
        names = expand_alias("fuse", target)
        assert names[0] == "infer-shapes" and names[-1] == lowering, (target, names)
        assert names.index("fuse-conv-bn") < names.index(mine[0])
        assert [n for n in names if n in mine] == mine
        for name in names:
            get_pass(name)


def test_new_opsets_lower_to_rmsnormalization_and_swish():
    body = ("two = Constant <value = float {2.0}> ()\ne = Constant <value = float {1e-6}> ()\n"
            "p = Pow (x, two)\nms = ReduceMean <axes=[-1]> (p)\nve = Add (ms, e)\ns = Sqrt (ve)\n"
            "n = Div (x, s)\nsg = Sigmoid (n)\ny = Mul (n, sg)")
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 17)
    proto.opset_import[0].version = 24  # ReduceMean keeps its axes attribute form in this text
    proto.ir_version = 11
    for node in proto.graph.node:
        if node.op_type == "ReduceMean":
            axes = node.attribute[0]
            node.ClearField("attribute")
            node.input.append("axes")
    import onnx.helper
    proto.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["axes"], value=onnx.helper.make_tensor(
        "axes", onnx.TensorProto.INT64, [1], [-1])))
    del axes
    _, stats, out = run(proto, "infer-shapes,fuse-layernorm,fuse-activations,dce,lower-standard")
    assert stats["fuse-layernorm"]["rmsnorm"] == 1 and stats["fuse-activations"]["silu"] == 1
    assert ops(out) == ["RMSNormalization", "Swish"]
    assert_same_outputs(proto, out, rtol=1e-5)


def test_float16_bias_gelu_fuses_and_lowers_to_a_float16_formula():
    """An fp16 export's GELU constants are fp16-rounded (sqrt(2) -> 1.4140625, 1.1e-4 off): they
    still match, and lower-standard's formula (opset 17: no Gelu op) takes fp16 constants for the
    bias Add's output, so ONNX Runtime runs it and agrees with the original."""
    rng = np.random.default_rng(0)
    body = ("m = MatMul (x, w)\nh = Add (m, b)\nd = Div (h, sqrt2)\ne = Erf (d)\np = Add (e, one)\n"
            "q = Mul (h, p)\ny = Mul (q, half)")
    inits = {"w": (rng.standard_normal((16, 32)) * 0.3).astype(np.float16),
             "b": rng.standard_normal(32).astype(np.float16),
             "sqrt2": np.array(np.sqrt(2.0), np.float16), "one": np.array(1.0, np.float16),
             "half": np.array(0.5, np.float16)}
    proto = model_text(body, "float16[2,4,16] x", "float16[2,4,32] y", 17, inits)
    _, stats, lowered = run(proto, "infer-shapes,fuse-gelu,dce,lower-standard")
    assert stats["fuse-gelu"]["gelu"] == 1 and stats["fuse-gelu"]["gelu-bias"] == 1, stats["fuse-gelu"]
    assert "Erf" in ops(lowered) and not any(n.domain == "passctl" for n in lowered.graph.node)
    floats = {i.name: i.data_type for i in lowered.graph.initializer if i.data_type != onnx.TensorProto.INT64}
    assert set(floats.values()) == {onnx.TensorProto.FLOAT16}, floats
    assert_same_outputs(proto, lowered, rtol=2e-3)
