"""fuse-skip-rmsnorm: residual Add + RMSNorm -> passctl::SkipRMSNorm; lowerings, TVM converter, SmolLM2."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from fusion_helpers import model_text, ops, run
from helpers import assert_same_outputs
from onnx import TensorProto, helper, numpy_helper

from passctl.ir import from_onnx
from passctl.passes.fusion.skip_rmsnorm import check_skip_rmsnorm
from passctl.support.check import compare, make_inputs, run_onnxruntime

FUSE = "infer-shapes,fuse-layernorm,fuse-skip-rmsnorm,dce"
RNG = np.random.default_rng(7)
W = RNG.uniform(0.5, 1.5, 8).astype(np.float32)
# LlamaRMSNorm as the dynamo exporter writes it: x * Reciprocal(Sqrt(mean(x^2) + eps)) * weight.
RMS = ("two = Constant <value = float {2.0}> ()\nsq = Pow (s, two)\n"
       "ax = Constant <value = int64[1] {-1}> ()\nms = ReduceMean <keepdims=1> (sq, ax)\n"
       "eps = Constant <value = float {1e-5}> ()\nme = Add (ms, eps)\n"
       "sd = Sqrt (me)\nr = Reciprocal (sd)\nn = Mul (s, r)\ny = Mul (n, W)\n")
PRE_NORM = "s = Add (a, h)\n" + RMS + "z = Add (s, y)"  # the sum also feeds the next residual Add


def _prenorm(shape="2,4,8", body=PRE_NORM, outputs=None, a_shape=None):
    a_shape = a_shape or shape
    return model_text(body, f"float[{a_shape}] a, float[{shape}] h", outputs or f"float[{shape}] z", 18,
                      {"W": W})


def _lower_both(proto):
    """{lowering: (fuse stats, lowering stats, lowered proto)}, each checked against ORT on ``proto``."""
    out = {}
    for lowering in ("lower-onnxruntime", "lower-standard"):
        _, stats, lowered = run(proto, f"{FUSE},{lowering}")
        assert stats[lowering]["unlowered"] == 0
        assert not any(n.domain == "passctl" for n in lowered.graph.node)
        assert_same_outputs(proto, lowered, seed=1, rtol=1e-5)
        out[lowering] = (stats["fuse-skip-rmsnorm"], stats[lowering], lowered)
    onnx.checker.check_model(out["lower-standard"][2], full_check=True)
    return out


def test_prenorm_residual_fuses_with_the_sum_as_second_output():
    got = _lower_both(_prenorm())
    fuse_stats, ort_stats, ort = got["lower-onnxruntime"]
    assert fuse_stats == {"skip_rmsnorm": 1, "with_sum": 1, "refused": 0}
    assert ort_stats["SkipRMSNorm->com.microsoft::SkipSimplifiedLayerNormalization"] == 1
    assert ops(ort) == ["com.microsoft::SkipSimplifiedLayerNormalization", "Add"]
    skip, add = ort.graph.node
    # outputs (output, mean, inv_std_var, input_skip_bias_sum): the sum is the 4th, read by the Add
    assert list(skip.input[:2]) == ["a", "h"] and skip.output[1:3] == ["", ""]
    assert skip.output[3] in add.input and skip.output[0] in add.input
    _, std_stats, std = got["lower-standard"]
    assert std_stats["SkipRMSNorm->Add+decomposed"] == 1  # opset 18: no RMSNormalization
    assert ops(std) == ["Add", "Mul", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]


def test_sum_used_only_by_the_norm_gives_one_output():
    body = "s = Add (a, h)\n" + RMS + "z = Identity (y)"
    got = _lower_both(_prenorm(body=body))
    fuse_stats, _, ort = got["lower-onnxruntime"]
    assert fuse_stats == {"skip_rmsnorm": 1, "with_sum": 0, "refused": 0}
    assert [len(n.output) for n in ort.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"] == [1]


def test_sum_that_is_a_graph_output_keeps_its_name():
    proto = _prenorm(body=PRE_NORM, outputs="float[2,4,8] z, float[2,4,8] s")
    got = _lower_both(proto)
    assert got["lower-onnxruntime"][0]["with_sum"] == 1
    for _, _, lowered in got.values():
        assert [o.name for o in lowered.graph.output] == ["z", "s"]


def test_opset_23_standard_lowering_uses_rms_normalization():
    proto = model_text(PRE_NORM, "float[2,4,8] a, float[2,4,8] h", "float[2,4,8] z", 23, {"W": W})
    _, stats, std = run(proto, f"{FUSE},lower-standard")
    assert stats["lower-standard"]["SkipRMSNorm->Add+RMSNormalization"] == 1
    assert ops(std) == ["Add", "RMSNormalization", "Add"]
    assert_same_outputs(proto, std, seed=2, rtol=1e-5)


def test_rank_4_falls_back_to_add_and_simplified_layernorm_for_ort():
    proto = _prenorm(shape="2,3,4,8")
    _, stats, ort = run(proto, f"{FUSE},lower-onnxruntime")
    assert stats["fuse-skip-rmsnorm"]["skip_rmsnorm"] == 1
    assert stats["lower-onnxruntime"]["SkipRMSNorm->Add+SimplifiedLayerNormalization"] == 1
    assert ops(ort) == ["Add", "SimplifiedLayerNormalization", "Add"]
    assert_same_outputs(proto, ort, seed=3, rtol=1e-5)


def test_broadcasting_add_is_not_fused_and_says_why():
    # 'a' is [2,1,8]: Add(a, h) broadcasts, not a residual connection of one shape.
    body = "s = Add (a, h)\n" + RMS + "z = Add (s, y)"
    proto = _prenorm(body=body, a_shape="2,1,8")
    model, stats, out = run(proto, f"{FUSE},lower-onnxruntime")
    assert stats["fuse-skip-rmsnorm"] == {"skip_rmsnorm": 0, "with_sum": 0, "refused": 1}
    assert ops(out) == ["Add", "SimplifiedLayerNormalization", "Add"]
    assert_same_outputs(proto, out, seed=4, rtol=1e-5)
    fused, _, _ = run(proto, FUSE)
    norm = next(n for n in fused.graph if n.op_type == "RMSNorm")
    add, result = check_skip_rmsnorm(norm)
    assert add is not None and add.op_type == "Add" and not result
    assert result.reason == ("SkipRMSNorm: shapes of 'a' (2x1x8) and 'h' (2x4x8) differ: the Add "
                             "broadcasts, it is no residual connection"), result.reason


def test_rmsnorm_not_fed_by_an_add_is_left_alone():
    body = "s = Relu (a)\n" + RMS + "z = Add (s, y)"
    proto = _prenorm(body=body)
    model, stats, out = run(proto, f"{FUSE},lower-onnxruntime")
    assert stats["fuse-skip-rmsnorm"] == {"skip_rmsnorm": 0, "with_sum": 0, "refused": 0}
    assert "SimplifiedLayerNormalization" in ops(out)
    fused, _, _ = run(proto, FUSE)
    _, result = check_skip_rmsnorm(next(n for n in fused.graph if n.op_type == "RMSNorm"))
    assert "is not made by an Add" in result.reason


def test_tvm_converter_maps_both_outputs(tmp_path):
    """passctl::SkipRMSNorm with its sum used, straight to the TVM emitter (no lowering), vs numpy."""
    pytest.importorskip("tvm")
    from passctl.targets import get_target
    from passctl.targets.tvm import TvmEmitter, load_artifact
    from passctl.targets.tvm.frontend import unsupported_nodes

    d = 32
    scale = RNG.uniform(0.5, 1.5, d).astype(np.float32)
    x, skip = (RNG.uniform(-2, 2, (2, 5, d)).astype(np.float32) for _ in range(2))
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5, d]) for n in ("x", "skip", "y", "s")]
    graph = helper.make_graph(
        [helper.make_node("SkipRMSNorm", ["x", "skip", "scale"], ["y", "s"], domain="passctl",
                          name="n0", epsilon=1e-6)],
        "g", vi[:2], vi[2:], [numpy_helper.from_array(scale, "scale")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("passctl", 1)])
    model = from_onnx(proto)
    assert unsupported_nodes(model) == []
    TvmEmitter(self_check=False).emit(model, get_target("cpu"), str(tmp_path / "a"))
    got = load_artifact(str(tmp_path / "a")).run({"x": x, "skip": skip})
    s = x + skip
    want = {"y": s / np.sqrt((s ** 2).mean(-1, keepdims=True) + 1e-6) * scale, "s": s}
    result = compare(want, {k: np.asarray(v) for k, v in got.items()})
    assert result.ok(2e-6), str(result)


def test_unsupported_nodes_still_refuses_a_used_second_output_of_other_passctl_ops():
    pytest.importorskip("tvm")
    from passctl.targets.tvm.frontend import unsupported_nodes

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ("x", "y", "extra")]
    graph = helper.make_graph([helper.make_node("RMSNorm", ["x"], ["y", "extra"], domain="passctl",
                                                name="n0", axis=-1, epsilon=1e-6)], "g", vi[:1], vi[1:])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                              helper.make_opsetid("passctl", 1)]))
    assert [why for _, why in unsupported_nodes(model)] == ["only its first output is mapped"]


@pytest.mark.slow
def test_smollm2_fuses_every_residual_add_and_keeps_outputs(tmp_path):
    """SmolLM2-135M (30 pre-norm decoder layers): 60 residual Adds (2 per layer) join an RMSNorm; the
    sums feed the next residual except the last (only the final norm reads it). ORT, seq 32."""
    from passctl.ir import load, save
    from passctl.passes import PassManager, build_pipeline
    from zoo import ZOO

    entry = ZOO["smollm2"]
    model = load(entry.path)
    result = PassManager(build_pipeline("cleanup,fuse")).run(model)
    stats = {r.name: r.stats for r in result.records}
    assert stats["fuse-skip-rmsnorm"] == {"skip_rmsnorm": 60, "with_sum": 59, "refused": 0}
    counts = collections.Counter(n.op_type for n in model.graph)
    assert counts["SkipSimplifiedLayerNormalization"] == 60 and counts["SimplifiedLayerNormalization"] == 1
    four = [n for n in model.graph if n.op_type == "SkipSimplifiedLayerNormalization" and len(n.outputs) == 4]
    assert len(four) == 59 and all(n.outputs[3].uses() for n in four)
    out = tmp_path / "model.onnx"
    save(model, str(out))
    feeds = make_inputs(entry.path, seed=0, dim_values={"batch": 1, "sequence": 32},
                        overrides=entry.input_overrides)
    reference = run_onnxruntime(entry.path, feeds)
    candidate = run_onnxruntime(str(out), feeds, optimize=True, threads=2)
    diff = compare(reference, candidate)
    assert list(candidate) == list(reference)
    assert diff.ok(1e-4), str(diff)
