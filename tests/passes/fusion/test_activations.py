"""fuse-activations: SiLU / Swish, HardSwish from HardSigmoid, Relu6 and Clip forms; refusals."""

from __future__ import annotations

import pytest
from fusion_helpers import check_both_lowerings, model_text, ops, run

from passctl.passes.rewrite import explain


@pytest.mark.parametrize("line", ["y = Mul (x, s)", "y = Mul (s, x)"])
def test_silu_both_orders(line):
    proto = model_text(f"s = Sigmoid (x)\n{line}", "float[2,4,8] x", "float[2,4,8] y", 17)
    lowered = check_both_lowerings(proto, "fuse-activations", {"silu": 1})
    assert ops(lowered["lower-onnxruntime"]) == ["com.microsoft::QuickGelu"]
    assert ops(lowered["lower-standard"]) == ["Sigmoid", "Mul"]


@pytest.mark.parametrize("beta,ort_ops", [("1.0", ["com.microsoft::QuickGelu"]), ("1.702", ["com.microsoft::QuickGelu"])])
def test_swish_with_beta(beta, ort_ops):
    body = f"b = Constant <value = float {{{beta}}}> ()\nxb = Mul (b, x)\ns = Sigmoid (xb)\ny = Mul (s, x)"
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 12)
    lowered = check_both_lowerings(proto, "fuse-activations", {"silu": 1, "swish-beta": 1})
    assert ops(lowered["lower-onnxruntime"]) == ort_ops


def test_swish_with_tensor_beta_is_refused():
    body = ("b = Constant <value = float[8] {1,1,1,1,1,1,1,2}> ()\nxb = Mul (x, b)\ns = Sigmoid (xb)\n"
            "y = Mul (x, s)")
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 17)
    model, stats, _ = run(proto, "infer-shapes,fuse-activations")
    assert stats["fuse-activations"]["silu"] == 0
    assert "Swish: beta 'b' is not a scalar float constant" in explain("swish-beta", model)


CLIP_IN = "z = Constant <value = float {0.0}> ()\nsix_ = Constant <value = float {6.0}> ()\nr = Clip (a, z, six_)"
CLIP_ATTR = "r = Clip <min = 0.0, max = 6.0> (a)"
HEAD = ("three = Constant <value = float {3.0}> ()\nsix = Constant <value = float {6.0}> ()\n"
        "sixth = Constant <value = float {0.16666667}> ()\n")
FORMS = {"div": "m = Mul (x, r)\ny = Div (m, six)", "mul": "m = Mul (r, x)\ny = Mul (sixth, m)",
         "x-div": "q = Div (r, six)\ny = Mul (q, x)", "x-mul": "q = Mul (r, sixth)\ny = Mul (x, q)"}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("clip,opset", [("clip-inputs", 13), ("clip-attrs", 10), ("clip-inputs", 14)])
def test_hardswish_relu6_forms(form, clip, opset):
    body = HEAD + "a = Add (three, x)\n" + (CLIP_IN if clip == "clip-inputs" else CLIP_ATTR) + "\n" + FORMS[form]
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", opset)
    lowered = check_both_lowerings(proto, "fuse-activations", {"hardswish": 1, f"hardswish-{form}-{clip}": 1})
    want = ["HardSwish"] if opset >= 14 else ["HardSigmoid", "Mul"]
    assert ops(lowered["lower-onnxruntime"]) == want == ops(lowered["lower-standard"])


def test_hardswish_from_hardsigmoid():
    body = "h = HardSigmoid <alpha = 0.16666667, beta = 0.5> (x)\ny = Mul (h, x)"
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 14)
    lowered = check_both_lowerings(proto, "fuse-activations", {"hardswish": 1, "hardswish-hardsigmoid": 1})
    assert ops(lowered["lower-onnxruntime"]) == ["HardSwish"]


def test_hardsigmoid_with_other_alpha_is_refused():
    body = "h = HardSigmoid <alpha = 0.2, beta = 0.5> (x)\ny = Mul (h, x)"
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 14)
    model, stats, _ = run(proto, "infer-shapes,fuse-activations")
    assert stats["fuse-activations"]["hardswish"] == 0
    assert "HardSigmoid alpha=0.2" in explain("hardswish-hardsigmoid", model)
    assert "is not HardSwish's alpha=1/6, beta=0.5" in explain("hardswish-hardsigmoid", model)


def test_clip_to_other_bound_is_not_hardswish():
    body = HEAD + "a = Add (three, x)\nr = Clip <min = 0.0, max = 5.0> (a)\n" + FORMS["div"]
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 10)
    model, stats, _ = run(proto, "infer-shapes,fuse-activations")
    assert stats["fuse-activations"]["hardswish"] == 0
    # The matcher stops at the Clip (max 5, not 6): Div and Mul matched, Clip not.
    assert "matched 2 of 4 pattern ops" in explain("hardswish-div-clip-attrs", model)
    assert ops(run(proto, "fuse-activations")[2]) == ["Add", "Clip", "Mul", "Div"]
