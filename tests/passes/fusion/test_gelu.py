"""fuse-gelu: erf and tanh GELU in every association / operand order, BiasGelu, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from fusion_helpers import check_both_lowerings, model_text, ops, run

from passctl.passes.rewrite import explain

RNG = np.random.default_rng(1)
CONSTS = ["half = Constant <value = float {0.5}> ()", "one = Constant <value = float {1.0}> ()",
          "sqrt2 = Constant <value = float {1.4142135}> ()", "isqrt2 = Constant <value = float {0.70710677}> ()",
          "three = Constant <value = float {3.0}> ()", "kappa = Constant <value = float {0.044715}> ()",
          "beta = Constant <value = float {0.7978846}> ()"]


def _outer(form, swap):
    """0.5 * v * h with h = 1 + t, in the three association orders (``swap`` flips every operand)."""
    a = (lambda p, q: f"{q}, {p}") if swap else (lambda p, q: f"{p}, {q}")
    if form == "half-x":
        return [f"hx = Mul ({a('v', 'half')})", f"y = Mul ({a('hx', 'h')})"]
    if form == "x-h":
        return [f"xh = Mul ({a('v', 'h')})", f"y = Mul ({a('xh', 'half')})"]
    return [f"hh = Mul ({a('h', 'half')})", f"y = Mul ({a('v', 'hh')})"]


def gelu_proto(kind="erf-div", form="half-x", swap=False, bias=False, opset=17, residual=False):
    a = (lambda p, q: f"{q}, {p}") if swap else (lambda p, q: f"{p}, {q}")
    lines = list(CONSTS)
    inits = {}
    if bias:
        lines += ["m = MatMul (x, Wm)", f"v = Add ({a('m', 'Bg')})"]
        inits = {"Wm": RNG.standard_normal((8, 8)).astype(np.float32),
                 "Bg": RNG.standard_normal(8).astype(np.float32)}
    elif residual:
        lines.append("v = Add (x, r)")
    else:
        lines.append("v = Identity (x)")
    if kind == "erf-div":
        lines += ["sc = Div (v, sqrt2)", "t = Erf (sc)"]
    elif kind == "erf-mul":
        lines += [f"sc = Mul ({a('v', 'isqrt2')})", "t = Erf (sc)"]
    else:
        lines += ["c = Pow (v, three)"] if kind == "tanh-pow" else [f"v2 = Mul (v, v)", f"c = Mul ({a('v', 'v2')})"]
        lines += [f"kc = Mul ({a('kappa', 'c')})", f"in = Add ({a('v', 'kc')})", f"bi = Mul ({a('beta', 'in')})",
                  "t = Tanh (bi)"]
    lines.append(f"h = Add ({a('t', 'one')})")
    lines += _outer(form, swap)
    inputs = "float[2,4,8] x" + (", float[2,4,8] r" if residual else "")
    return model_text("\n".join(lines), inputs, "float[2,4,8] y", opset, inits)


@pytest.mark.parametrize("kind", ["erf-div", "erf-mul", "tanh-pow", "tanh-cube"])
@pytest.mark.parametrize("form", ["half-x", "x-h", "half-h"])
def test_gelu_forms_fuse_and_match_ort(kind, form):
    for swap in (False, True):
        proto = gelu_proto(kind, form, swap)
        family = "gelu" if kind.startswith("erf") else "fast_gelu"
        inner = {"erf-div": "erf-div", "erf-mul": "erf-mul", "tanh-pow": "tanh-pow", "tanh-cube": "tanh-cube"}[kind]
        lowered = check_both_lowerings(proto, "fuse-gelu", {family: 1, f"gelu-{inner}-{form}": 1}, seed=3)
        want = "com.microsoft::Gelu" if family == "gelu" else "com.microsoft::FastGelu"
        assert ops(lowered["lower-onnxruntime"]) == ["Identity", want]


@pytest.mark.parametrize("kind,ort_op", [("erf-div", "com.microsoft::BiasGelu"),
                                         ("tanh-pow", "com.microsoft::FastGelu")])
def test_bias_gelu(kind, ort_op):
    for swap in (False, True):
        proto = gelu_proto(kind, "x-h", swap, bias=True)
        lowered = check_both_lowerings(proto, "fuse-gelu", {"bias_gelu": 1}, seed=4)
        assert ops(lowered["lower-onnxruntime"]) == ["MatMul", ort_op]


def test_gelu_opset_20_lowers_to_standard_gelu():
    proto = gelu_proto("tanh-pow", "half-h", opset=20)
    lowered = check_both_lowerings(proto, "fuse-gelu", {"fast_gelu": 1})
    assert ops(lowered["lower-standard"]) == ["Identity", "Gelu"]


def test_residual_add_is_not_taken_as_a_bias():
    proto = gelu_proto("erf-div", "x-h", residual=True)
    model, stats, _ = run(proto, "infer-shapes,fuse-gelu")
    assert stats["fuse-gelu"]["gelu"] == 1 and stats["fuse-gelu"]["bias_gelu"] == 0
    report = explain("gelu-bias", model)
    assert "BiasGelu: bias '" in report and "is not a constant of shape [D] (its shape is 2x4x8)" in report
    check_both_lowerings(proto, "fuse-gelu", {"gelu": 1, "bias_gelu": 0})


def test_wrong_constant_does_not_fuse_and_says_which():
    proto = gelu_proto("erf-div", "x-h")
    for node in proto.graph.node:
        if node.output[0] == "sqrt2":
            node.attribute[0].t.raw_data = np.array(1.5, np.float32).tobytes()
    model, stats, _ = run(proto, "infer-shapes,fuse-gelu")
    assert stats["fuse-gelu"]["gelu"] == 0
    assert "is not the constant 1.414" in explain("gelu-erf-div-x-h", model)


def test_intermediate_with_another_consumer_blocks():
    proto = gelu_proto("erf-div", "x-h")
    import onnx.helper
    proto.graph.output.append(onnx.helper.make_tensor_value_info("t", 1, [2, 4, 8]))
    model, stats, _ = run(proto, "infer-shapes,fuse-gelu")
    assert stats["fuse-gelu"]["gelu"] == 0
    assert "intermediate value 't' of Erf" in explain("gelu-erf-div-x-h", model)
