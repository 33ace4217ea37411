"""Fusions that did not fire on real exports (issue 15, bug 8), each built by the exporter that
writes it (torch's TorchScript exporter, ``dynamo=False``; it takes milliseconds), compiled with
``cleanup,fuse`` (and ``reparam`` before it), compared with ONNX Runtime on the original within
1e-5 relative; plus case 15-rmsnorm-div-sqrt as filed, and RMSNorm's lowering per opset (bug 11,
case 04-rmsnorm-checker).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusion_helpers import ops, run
from helpers import assert_same_outputs

from passctl.ir import from_onnx
from passctl.passes.lowering.lower_onnxruntime import runtime_only_ops

CASES = Path(__file__).resolve().parents[2] / "cases"


def _export(module, shape, opset: int) -> onnx.ModelProto:
    import torch

    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(*shape),), buf, opset_version=opset, dynamo=False,
                          input_names=["x"], output_names=["y"])
    return onnx.load_from_string(buf.getvalue())


def _modules():
    import torch

    class RMSNorm(torch.nn.Module):
        """LLaMA's RMSNorm with torch.rsqrt: the legacy exporter writes Div(1, Sqrt(...))."""

        def __init__(self, d=16):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    class LinearGelu(torch.nn.Module):
        def __init__(self, approximate="none"):
            super().__init__()
            self.linear = torch.nn.Linear(16, 32)
            self.approximate = approximate

        def forward(self, x):
            return torch.nn.functional.gelu(self.linear(x), approximate=self.approximate)

    class ConvGeluConv(torch.nn.Module):
        """Conv -> GELU -> Conv: the legacy exporter writes GELU as Mul(Mul(x, h), 0.5), whose
        ``* 0.5`` reparam could fold into the second Conv."""

        def __init__(self, act="gelu"):
            super().__init__()
            self.c1 = torch.nn.Conv2d(4, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.act = act

        def forward(self, x):
            y = self.c1(x)
            if self.act == "gelu":
                y = torch.nn.functional.gelu(y)
            else:  # HardSwish as MobileNetV3 code writes it by hand: x * relu6(x + 3) / 6
                y = y * torch.nn.functional.relu6(y + 3.0) / 6.0
            return self.c2(y)

    return RMSNorm, LinearGelu, ConvGeluConv


def _stats_sum(stats, key):
    return sum(s.get(key, 0) for s in stats.values())


@pytest.mark.parametrize("opset", [17, 20])
def test_rmsnorm_rsqrt_as_div_one_fuses(opset):
    RMSNorm, _, _ = _modules()
    proto = _export(RMSNorm(), (2, 3, 16), opset)
    assert "Div" in ops(proto) and "Reciprocal" not in ops(proto)
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["fuse-layernorm"]["rmsnorm"] == 1 and stats["fuse-layernorm"]["rmsnorm-scale"] == 1
    assert stats["fuse-layernorm"]["rmsnorm-pow-div-one-axes-" + ("attr" if opset < 18 else "input")] == 1
    assert ops(out) == ["SimplifiedLayerNormalization"]
    assert_same_outputs(proto, out, rtol=1e-5)


def test_case_15_rmsnorm_div_sqrt():
    proto = onnx.load(CASES / "15-rmsnorm-div-sqrt" / "model.onnx")
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["fuse-layernorm"]["rmsnorm"] == 1 and stats["fuse-layernorm"]["rmsnorm-scale"] == 1
    assert ops(out) == ["SimplifiedLayerNormalization"]
    assert_same_outputs(proto, out, rtol=1e-5)


def test_layernorm_div_one_fuses():
    """The same spelling in a LayerNorm: (x - mean) * Div(1, sqrt(var + eps))."""
    from fusion_helpers import model_text

    body = """
        m = ReduceMean <axes=[-1]> (x)
        d = Sub (x, m)
        p = Mul (d, d)
        v = ReduceMean <axes=[-1]> (p)
        ve = Add (v, eps)
        s = Sqrt (ve)
        r = Div (one, s)
        y = Mul (d, r)"""
    proto = model_text(body, "float[2,4,8] x", "float[2,4,8] y", 17,
                       {"eps": np.array(1e-5, np.float32), "one": np.array(1.0, np.float32)})
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["fuse-layernorm"]["layernorm-mul-div-one-axes-attr"] == 1
    assert ops(out) == ["LayerNormalization"]
    assert_same_outputs(proto, out, rtol=1e-5)


@pytest.mark.parametrize("approximate,kernel", [("none", "BiasGelu"), ("tanh", "FastGelu")])
def test_onnx_gelu_20_after_bias_add_becomes_bias_gelu(approximate, kernel):
    """opset 20: both exporters write F.gelu as the ONNX Gelu op after the Linear's Add."""
    _, LinearGelu, _ = _modules()
    proto = _export(LinearGelu(approximate), (2, 3, 16), 20)
    assert ops(proto) == ["MatMul", "Add", "Gelu"]
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["fuse-gelu"]["bias_gelu"] == 1 and stats["fuse-gelu"]["gelu-bias-from-onnx"] == 1
    assert ops(out) == ["MatMul", f"com.microsoft::{kernel}"]
    assert_same_outputs(proto, out, rtol=1e-5)
    # The standard lowering writes it back as Add + Gelu-20 (portable ONNX).
    _, _, std = run(proto, "cleanup,fuse-gelu,lower-standard")
    assert ops(std) == ["MatMul", "Add", "Gelu"]
    onnx.checker.check_model(std, full_check=True)
    assert_same_outputs(proto, std, rtol=1e-5)


def test_onnx_gelu_without_bias_stays_standard():
    from fusion_helpers import model_text

    proto = model_text("y = Gelu (x)", "float[2,8] x", "float[2,8] y", 20)
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["fuse-gelu"]["bias_gelu"] == 0
    assert ops(out) == ["Gelu"]


@pytest.mark.parametrize("act,family", [("gelu", "gelu"), ("hardswish", "hardswish")])
def test_reparam_before_fuse_keeps_the_activation(act, family):
    """reparam folds per-channel Mul / Div steps into a neighbouring Conv; GELU's ``* 0.5`` and
    HardSwish's ``/ 6`` are steps of an activation that fuse fuses, and stay."""
    _, _, ConvGeluConv = _modules()
    proto = _export(ConvGeluConv(act), (1, 4, 8, 8), 17)
    _, stats, out = run(proto, "cleanup,reparam,fuse")
    assert _stats_sum(stats, family) == 1, stats
    assert stats["reparam-branches"]["folded"] == 0
    assert [o for o in ops(out) if o not in ("Conv",)] == (
        ["com.microsoft::Gelu"] if act == "gelu" else ["HardSwish"])
    assert_same_outputs(proto, out, rtol=1e-5)


def test_reparam_still_folds_a_plain_scale_into_the_conv():
    """Control: a per-channel Mul that is no activation's step is still folded."""
    from fusion_helpers import model_text

    rng = np.random.default_rng(0)
    body = """
        c = Conv <pads=[1,1,1,1]> (x, w1, b1)
        r = Relu (c)
        m = Mul (r, half)
        y = Conv <pads=[1,1,1,1]> (m, w2, b2)"""
    proto = model_text(body, "float[1,4,8,8] x", "float[1,8,8,8] y", 17, {
        "w1": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(8).astype(np.float32),
        "half": np.array(0.5, np.float32),
        "w2": rng.standard_normal((8, 8, 3, 3)).astype(np.float32),
        "b2": rng.standard_normal(8).astype(np.float32)})
    _, stats, out = run(proto, "cleanup,reparam,fuse")
    assert stats["reparam-branches"]["folded"] == 1
    assert "Mul" not in ops(out)
    assert_same_outputs(proto, out, rtol=1e-5)


def _rms_model(opset: int) -> onnx.ModelProto:
    proto = onnx.load(CASES / "04-rmsnorm-checker" / "model.onnx")
    if opset != 17:
        proto = onnx.version_converter.convert_version(proto, opset)
    return proto


def test_case_04_rmsnorm_below_opset_23_is_reported_onnx_runtime_only():
    """Case 04 (opset 17): ONNX has no RMSNorm op there; ONNX Runtime's SimplifiedLayerNormalization
    is registered in the default domain only (com.microsoft has no kernel of that name), so the
    artifact runs in ONNX Runtime only, and runtime_only_ops (the report's
    artifact.runtime_only_ops) says so; onnx.checker refuses exactly that op."""
    proto = _rms_model(17)
    model, stats, out = run(proto, "cleanup,fuse")
    assert ops(out) == ["SimplifiedLayerNormalization"]
    assert runtime_only_ops(from_onnx(out)) == {"::SimplifiedLayerNormalization": 1}
    assert stats["lower-onnxruntime"]["runtime_only_ops"] == 1
    with pytest.raises(onnx.checker.ValidationError, match="SimplifiedLayerNormalization"):
        onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(proto, out, rtol=1e-5)


def test_rmsnorm_at_opset_23_is_the_standard_op_and_passes_the_checker():
    proto = _rms_model(23)
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["lower-onnxruntime"]["RMSNorm->RMSNormalization"] == 1
    assert ops(out) == ["RMSNormalization"]
    assert runtime_only_ops(from_onnx(out)) == {}
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(proto, out, rtol=1e-5)


def test_skip_rmsnorm_fallback_at_opset_23_is_standard():
    """A residual Add + RMSNorm of rank 4 (no contrib kernel) lowers to Add + RMSNormalization."""
    from fusion_helpers import model_text

    body = """
        s = Add (a, b)
        p = Mul (s, s)
        m = ReduceMean (p, ax)
        ve = Add (m, eps)
        r = Sqrt (ve)
        n = Div (s, r)
        y = Mul (n, w)"""
    rng = np.random.default_rng(0)
    proto = model_text(body, "float[2,2,3,8] a, float[2,2,3,8] b", "float[2,2,3,8] y", 23, {
        "ax": np.array([-1], np.int64), "eps": np.array(1e-6, np.float32),
        "w": (rng.random(8) + 0.5).astype(np.float32)})
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["lower-onnxruntime"].get("SkipRMSNorm->Add+RMSNormalization", 0) == 1, stats
    assert ops(out) == ["Add", "RMSNormalization"]
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(proto, out, rtol=1e-5)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_pow_minus_half_normalize_fuses(norm):
    """``x * torch.pow(mean(x^2) + eps, -0.5)``, as hand-written RMSNorms (and the exporters of
    it) write the inverse square root."""
    import torch

    class Norm(torch.nn.Module):
        def forward(self, x):
            d = x - x.mean(-1, keepdim=True) if norm == "layernorm" else x
            return d * torch.pow(d.pow(2).mean(-1, keepdim=True) + 1e-5, -0.5)

    proto = _export(Norm(), (2, 3, 16), 17)
    assert "Sqrt" not in ops(proto)
    _, stats, out = run(proto, "cleanup,fuse")
    assert stats["fuse-layernorm"][norm] == 1, stats["fuse-layernorm"]
    assert ops(out) == ["LayerNormalization" if norm == "layernorm" else "SimplifiedLayerNormalization"]
    assert_same_outputs(proto, out, rtol=1e-5)


@pytest.mark.parametrize("opset", [17, 18])
def test_portable_rmsnorm_below_opset_23_passes_the_checker_and_ort_fuses_it_back(tmp_path, opset):
    """lower-onnxruntime{portable=true}: case 04 (opset 17) as Pow / ReduceMean / Add / Sqrt /
    Div / Mul, which onnx.checker accepts and which ONNX Runtime's own SimplifiedLayerNormFusion
    turns back into SimplifiedLayerNormalization at ORT_ENABLE_EXTENDED (the shipped level is
    ORT_ENABLE_ALL), so the artifact keeps the fused kernel."""
    import onnxruntime as ort

    proto = _rms_model(opset)
    _, stats, out = run(proto, "cleanup,fuse-layernorm,lower-onnxruntime{portable=true}")
    assert stats["lower-onnxruntime"]["RMSNorm->decomposed"] == 1
    assert runtime_only_ops(from_onnx(out)) == {}
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(proto, out, rtol=1e-5)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node] == [
        "SimplifiedLayerNormalization"]
