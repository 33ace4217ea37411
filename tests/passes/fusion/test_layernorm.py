"""fuse-layernorm: decomposed LayerNorm / SkipLayerNorm / RMSNorm variants, counts, ORT numerics,
and the cases where the math would differ (each refused with its reason)."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import check_both_lowerings, model_text, ops, run
from helpers import assert_same_outputs

from passctl.passes.rewrite import explain

RNG = np.random.default_rng(0)
W = RNG.standard_normal(8).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)


def ln_proto(square="pow", normalize="div", axes="attr", params="scale-bias", swap=False, opset=17,
             keepdims=1, axis=-1, eps="e", scale_shape=(8,), extra="", xshape="[2,4,8]"):
    """One decomposed LayerNorm on x: float[2,4,8] written as the exporters write it."""
    red = (lambda v, out: f"{out} = ReduceMean <axes=[{axis}], keepdims={keepdims}> ({v})") if axes == "attr" \
        else (lambda v, out: f"{out} = ReduceMean <keepdims={keepdims}> ({v}, ax)")
    lines = ["ax = Constant <value = int64[1] {" + str(axis) + "}> ()",
             "two = Constant <value = float {2.0}> ()", "e = Constant <value = float {1e-5}> ()",
             red("x", "m"), "d = Sub (x, m)",
             "p = Pow (d, two)" if square == "pow" else "p = Mul (d, d)", red("p", "v"),
             f"ve = Add ({eps}, v)" if swap else f"ve = Add (v, {eps})", "s = Sqrt (ve)"]
    if normalize == "div":
        lines.append("n = Div (d, s)")
    else:
        lines += ["r = Reciprocal (s)", "n = Mul (r, d)" if swap else "n = Mul (d, r)"]
    inits = {}
    y = "n"
    if "scale" in params:
        lines.append("sc = Mul (W, n)" if swap else "sc = Mul (n, W)")
        inits["W"] = RNG.standard_normal(scale_shape).astype(np.float32)
        y = "sc"
    if "bias" in params:
        lines.append(f"b = Add (B, {y})" if swap else f"b = Add ({y}, B)")
        inits["B"] = B
        y = "b"
    lines.append(f"y = Identity ({y})")
    lines.append(extra)
    inputs = f"float{xshape} x" + (", float eps_in" if eps == "eps_in" else "")
    outs = f"float{xshape} y" if "side" not in extra else f"float{xshape} y, float{xshape} side"
    return model_text("\n".join(lines), inputs, outs, opset, inits)


@pytest.mark.parametrize("square,normalize,axes,params,swap,opset", [
    ("pow", "div", "attr", "scale-bias", False, 17),
    ("pow", "div", "attr", "scale-bias", True, 13),
    ("mul", "div", "attr", "scale", False, 17),
    ("pow", "reciprocal", "attr", "none", False, 17),
    ("mul", "reciprocal", "attr", "scale-bias", True, 12),
    ("pow", "div", "input", "scale-bias", False, 18),
    ("mul", "reciprocal", "input", "scale-bias", True, 18),
    ("pow", "reciprocal", "input", "scale", False, 18),
])
def test_layernorm_variants_fuse_and_match_ort(square, normalize, axes, params, swap, opset):
    proto = ln_proto(square, normalize, axes, params, swap, opset)
    lowered = check_both_lowerings(proto, "fuse-layernorm", {
        "layernorm": 1, f"layernorm-{square}-{normalize}-axes-{axes}": 1,
        "layernorm-scale": int("scale" in params), "layernorm-bias": int("bias" in params)}, seed=opset)
    assert ops(lowered["lower-onnxruntime"]) == ["LayerNormalization", "Identity"]
    std_ops = ops(lowered["lower-standard"])
    assert ("LayerNormalization" in std_ops) == (opset >= 17)


def test_scale_as_1x1xD_is_reshaped_to_D():
    proto = ln_proto(scale_shape=(1, 1, 8))
    lowered = check_both_lowerings(proto, "fuse-layernorm", {"layernorm": 1, "layernorm-scale": 1})
    assert ops(lowered["lower-onnxruntime"]) == ["LayerNormalization", "Identity"]


def _fused(proto):
    model, stats, _ = run(proto, "infer-shapes,fuse-layernorm")
    return model, stats["fuse-layernorm"]


def test_not_last_axis_is_refused_with_reason():
    proto = ln_proto(axis=1)
    model, stats = _fused(proto)
    assert stats["layernorm"] == 0
    report = explain("layernorm-pow-div-axes-attr", model)
    assert "LayerNorm: normalization over axes [1] of 'x' (rank 3), not over the last axis only" in report


def test_last_axis_written_as_rank_minus_one_fuses():
    check_both_lowerings(ln_proto(axis=2), "fuse-layernorm", {"layernorm": 1})


def test_keepdims_0_is_refused_with_reason():
    # keepdims=0 on both ReduceMeans: x[8,8,8] - m[8,8] broadcasts m along the last axis: other math.
    proto = ln_proto(keepdims=0, params="none", xshape="[8,8,8]")
    model, stats, out = run(proto, "infer-shapes,fuse-layernorm")
    assert stats["fuse-layernorm"]["layernorm"] == 0
    assert "ReduceMean keepdims=0 drops the reduced axis" in explain("layernorm-pow-div-axes-attr", model)
    assert_same_outputs(proto, out, rtol=1e-5)


def test_epsilon_not_constant_is_refused_with_reason():
    proto = ln_proto(eps="eps_in")
    model, stats = _fused(proto)
    assert stats["layernorm"] == 0
    assert "LayerNorm: epsilon 'eps_in' is not a constant" in explain("layernorm-pow-div-axes-attr", model)


def test_epsilon_not_scalar_is_refused_with_reason():
    proto = model_text("\n".join(["ev = Constant <value = float[8] {1e-5,1e-5,1e-5,1e-5,1e-5,1e-5,1e-5,2e-5}> ()",
                                  "m = ReduceMean <axes=[-1]> (x)", "d = Sub (x, m)", "p = Mul (d, d)",
                                  "v = ReduceMean <axes=[-1]> (p)", "ve = Add (v, ev)", "s = Sqrt (ve)",
                                  "y = Div (d, s)"]), "float[2,4,8] x", "float[2,4,8] y")
    model, stats = _fused(proto)
    assert stats["layernorm"] == 0
    assert "LayerNorm: epsilon 'ev' has shape [8], not a scalar" in explain("layernorm-mul-div-axes-attr",
                                                                            model)


def test_scale_of_other_shape_is_not_absorbed_and_says_why():
    # A final Mul by a [4, 1] constant scales rows, not the normalized dimension [8]: the LayerNorm
    # itself is fused, the Mul stays a Mul, and the numerics are unchanged.
    proto = ln_proto(scale_shape=(4, 1), params="scale")
    model, stats = _fused(proto)
    assert stats["layernorm"] == 1 and stats.get("layernorm-scale", 0) == 0
    report = explain("layernorm-scale", model)
    assert ("LayerNorm: scale 'W' has shape [4, 1], which does not broadcast to the normalized shape [8] "
            "of 'x'") in report
    check_both_lowerings(proto, "fuse-layernorm", {"layernorm": 1, "layernorm-scale": 0})


def test_scale_of_other_length_is_refused():
    proto = ln_proto(scale_shape=(1,), params="scale")  # [1] broadcasts to [8]: absorbed as 8 copies
    check_both_lowerings(proto, "fuse-layernorm", {"layernorm": 1, "layernorm-scale": 1})


def test_intermediate_with_another_consumer_is_refused_with_reason():
    proto = ln_proto(params="none", extra="side = Neg (d)")
    report = explain("layernorm-pow-div-axes-attr", run(proto, "infer-shapes")[0])
    # The LayerNorm is refused; what is left, d / sqrt(mean(d^2) + eps), is exactly an RMSNorm of d.
    check_both_lowerings(proto, "fuse-layernorm", {"layernorm": 0, "rmsnorm": 1})
    assert "blocked: intermediate value 'd' of Sub" in report and "has another consumer outside the match: Neg" \
        in report


def skip_proto(with_bias=True, swap=False, rank=3):
    shape = "[2,4,8]" if rank == 3 else "[4,8]"
    lines = ["h = MatMul (a, Wm)"]
    if with_bias:
        lines.append("hb = Add (Bm, h)" if swap else "hb = Add (h, Bm)")
    x = "hb" if with_bias else "h"
    lines += [f"s = Add (res, {x})" if swap else f"s = Add ({x}, res)",
              "y = LayerNormalization <axis=-1, epsilon=1e-5> (s, W, B)"]
    inits = {"Wm": RNG.standard_normal((8, 8)).astype(np.float32), "W": W, "B": B,
             "Bm": RNG.standard_normal(8).astype(np.float32)}
    if not with_bias:
        inits.pop("Bm")
    return model_text("\n".join(lines), f"float{shape} a, float{shape} res", f"float{shape} y", 17, inits)


@pytest.mark.parametrize("with_bias,swap,rank", [(True, False, 3), (True, True, 3), (False, False, 3),
                                                (True, False, 2)])
def test_skip_layernorm_from_standard_layernorm(with_bias, swap, rank):
    proto = skip_proto(with_bias, swap, rank)
    lowered = check_both_lowerings(proto, "fuse-layernorm", {
        "skip_layernorm": 1, "from_onnx": 1, f"skip-layernorm-{'bias' if with_bias else 'nobias'}-3": 1})
    # ONNX Runtime's CPU provider runs Add + LayerNormalization faster than its SkipLayerNormalization
    # kernel (see lower_onnxruntime.py), so that is the ORT form.
    adds = ["Add", "Add"] if with_bias else ["Add"]
    assert ops(lowered["lower-onnxruntime"]) == ["MatMul", *adds, "LayerNormalization"]


def test_skip_layernorm_from_decomposed_layernorm():
    proto = ln_proto(params="scale-bias", opset=13)
    # x = a + res feeding the decomposed LayerNorm
    import onnx.helper
    g = proto.graph
    g.input[0].name = "xa"
    g.input.append(onnx.helper.make_tensor_value_info("res", 1, [2, 4, 8]))
    g.node.insert(0, onnx.helper.make_node("Add", ["xa", "res"], ["x"]))
    check_both_lowerings(proto, "fuse-layernorm", {"layernorm": 1, "skip_layernorm": 1,
                                                   "skip-layernorm-nobias-3": 1})


def test_residual_sum_used_again_keeps_its_add():
    # Pre-norm residual stream: the sum feeds the next block too, so the Add stays (ORT's
    # SkipLayerNormalization could output the sum, but the rule engine refuses the match).
    proto = skip_proto(with_bias=False)
    import onnx.helper
    proto.graph.output.append(onnx.helper.make_tensor_value_info("s", 1, [2, 4, 8]))
    model, stats, _ = run(proto, "infer-shapes,fuse-layernorm")
    assert stats["fuse-layernorm"]["skip_layernorm"] == 0
    assert "intermediate value 's' of Add" in explain("skip-layernorm-nobias-3", model)


def rms_proto(square="pow", normalize="reciprocal", axes="input", cast=False, weight_first=True, opset=18):
    """LLaMA's RMSNorm: weight * (x * rsqrt(mean(x^2) + eps)), as transformers exports write it."""
    red = "ms = ReduceMean <keepdims=1> (p, ax)" if axes == "input" else "ms = ReduceMean <axes=[-1]> (p)"
    xin = "xc" if cast else "x"
    lines = ["ax = Constant <value = int64[1] {-1}> ()", "two = Constant <value = float {2.0}> ()",
             "e = Constant <value = float {1e-6}> ()"]
    if cast:
        lines.append("xc = Cast <to=1> (x)")
    lines += [f"p = Pow ({xin}, two)" if square == "pow" else f"p = Mul ({xin}, {xin})", red,
              "ve = Add (ms, e)", "s = Sqrt (ve)"]
    if normalize == "reciprocal":
        lines += ["r = Reciprocal (s)", f"n = Mul ({xin}, r)"]
    else:
        lines.append(f"n = Div ({xin}, s)")
    if cast:
        lines.append("n2 = Cast <to=1> (n)")
    last = "n2" if cast else "n"
    lines.append(f"y = Mul (W, {last})" if weight_first else f"y = Mul ({last}, W)")
    return model_text("\n".join(lines), "float[2,4,8] x", "float[2,4,8] y", opset, {"W": W})


@pytest.mark.parametrize("square,normalize,axes,cast,weight_first,opset", [
    ("pow", "reciprocal", "input", False, True, 18),
    ("pow", "reciprocal", "input", True, True, 18),
    ("mul", "div", "attr", False, False, 13),
    ("pow", "div", "attr", True, False, 17),
])
def test_rmsnorm_variants(square, normalize, axes, cast, weight_first, opset):
    proto = rms_proto(square, normalize, axes, cast, weight_first, opset)
    lowered = check_both_lowerings(proto, "fuse-layernorm", {
        "rmsnorm": 1, f"rmsnorm-{square}-{normalize}-axes-{axes}": 1, "rmsnorm-scale": int(not cast),
        "rmsnorm-cast-noop": int(cast)})
    ort_ops = ops(lowered["lower-onnxruntime"])
    assert "SimplifiedLayerNormalization" in ort_ops


def test_rmsnorm_weight_of_other_shape_stays_a_mul():
    proto = rms_proto()
    proto.graph.initializer[0].CopyFrom(__import__("onnx").numpy_helper.from_array(
        RNG.standard_normal((4, 1)).astype(np.float32), "W"))
    model, stats, out = run(proto, "infer-shapes,fuse-layernorm,lower-onnxruntime")
    assert stats["fuse-layernorm"]["rmsnorm"] == 1 and "rmsnorm-scale" not in stats["fuse-layernorm"]
    assert ops(out) == ["SimplifiedLayerNormalization", "Mul"]
    assert_same_outputs(proto, out, rtol=1e-5)
