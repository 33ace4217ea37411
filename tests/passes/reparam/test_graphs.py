"""reparam-branches on onnx.parser graphs: bare and BN identity, per-channel constants, and blocks it
must leave alone with the reason in the pass statistics."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
from reparam_helpers import max_rel, op_counts, parsed_with_weights, reparam_stats, run_reparam

from passctl.ir import from_onnx, to_onnx
from passctl.passes.registry import expand_alias
from passctl.passes.reparam import explain_reparam

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
BN = "float[{c}] s{i}, float[{c}] b{i}, float[{c}] m{i}, float[{c}] var{i}"


def _bn_inputs(c, *ids):
    return ", ".join(BN.format(c=c, i=i) for i in ids)


def _inits(proto):
    return {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in proto.graph.initializer}


def _fold(inits, i, eps=1e-5):
    s = inits[f"s{i}"] / np.sqrt(inits[f"var{i}"] + eps)
    return s, inits[f"b{i}"] - inits[f"m{i}"] * s


def test_repvgg_grouped_block_with_bn_identity_exact_kernel():
    """RepVGG (Ding et al. 2021, Sec. 3.3) with group 2: kxk-BN + 1x1-BN + BN identity; the expected
    kernel is built here in numpy: 1x1 at the centre, identity one-hot at [o, o % (C/g), 1, 1]."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,6,6] x, float[4,2,3,3] w3, float[4,2,1,1] w1, {_bn_inputs(4, 3, 1, 0)})
            => (float[1,4,6,6] y) {{
            c3 = Conv <pads = [1,1,1,1], group = 2> (x, w3)
            n3 = BatchNormalization <epsilon = 0.001> (c3, s3, b3, m3, var3)
            c1 = Conv <group = 2> (x, w1)
            n1 = BatchNormalization <epsilon = 0.01> (c1, s1, b1, m1, var1)
            n0 = BatchNormalization (x, s0, b0, m0, var0)
            a = Add (n3, n1)
            r = Add (a, n0)
            y = Relu (r)
        }}""")
    out, result = run_reparam(proto)
    assert op_counts(out) == {"Conv": 1, "Relu": 1}
    assert reparam_stats(result) == {"merged": 1, "branches": 3, "folded": 0}
    text = explain_reparam(from_onnx(proto))
    assert "1 block(s) merged" in text and "(3 branches) -> one Conv, 3x3 kernel" in text
    assert "group 2" in text
    inits = _inits(proto)
    (s3, t3), (s1, t1), (s0, t0) = _fold(inits, 3, 1e-3), _fold(inits, 1, 1e-2), _fold(inits, 0)
    expected = inits["w3"] * s3[:, None, None, None]
    expected[:, :, 1:2, 1:2] += inits["w1"] * s1[:, None, None, None]
    for o in range(4):
        expected[o, o % 2, 1, 1] += s0[o]
    conv = out.graph.node[0]
    got = _inits(out)
    np.testing.assert_allclose(got[conv.input[1]], expected, rtol=1e-6)
    np.testing.assert_allclose(got[conv.input[2]], t3 + t1 + t0, rtol=1e-6)
    assert max_rel(proto, out) <= 1e-5


def test_bare_identity_and_per_channel_constants():
    """y = x + Mul(Conv(x), c) + Add const, then Sub/Div constants: all one Conv with bias."""
    proto = parsed_with_weights(HEADER + """
        g (float[1,4,6,6] x, float[4,4,3,3] w, float[4] wb, float[1,4,1,1] scale, float[4,1,1] shift,
           float[1] sub, float[1,4,1,1] div) => (float[1,4,6,6] y) {
            c = Conv <pads = [1,1,1,1]> (x, w, wb)
            m = Mul (scale, c)
            p = Add (m, shift)
            q = Sub (p, sub)
            d = Div (q, div)
            r = Add (x, d)
            y = Relu (r)
        }""")
    out, result = run_reparam(proto)
    assert op_counts(out) == {"Conv": 1, "Relu": 1}
    assert reparam_stats(result)["merged"] == 1
    assert max_rel(proto, out) <= 1e-5


def test_single_branch_conv_bn_mul_fold():
    """A Conv followed by BN and a per-channel Mul, no branches: folded (the fuse-conv-bn math)."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,3,6,6] x, float[4,3,3,3] w, {_bn_inputs(4, 1)}, float[1,4,1,1] k)
            => (float[1,4,4,4] y) {{
            c = Conv (x, w)
            n = BatchNormalization (c, s1, b1, m1, var1)
            y = Mul (n, k)
        }}""")
    out, result = run_reparam(proto)
    assert op_counts(out) == {"Conv": 1}
    assert reparam_stats(result) == {"merged": 0, "branches": 0, "folded": 1}
    inits, got = _inits(proto), _inits(out)
    s, t = _fold(inits, 1)
    s = s * inits["k"].reshape(-1)
    t = t * inits["k"].reshape(-1)
    conv = out.graph.node[0]
    np.testing.assert_allclose(got[conv.input[1]], inits["w"] * s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(got[conv.input[2]], t, rtol=1e-6)


def _assert_unmerged(proto, reason_part, convs_after):
    out, result = run_reparam(proto)
    stats = reparam_stats(result)
    assert stats["merged"] == 0 and stats["unmerged"] == 1
    (reason,) = result.reparam_pass.unmerged.values()
    assert reason_part in reason, reason
    # explain_reparam tells the same, without changing the model.
    model = from_onnx(proto)
    text = explain_reparam(model)
    assert "0 block(s) merged" in text and reason in text
    assert op_counts(to_onnx(model)) == op_counts(proto)
    counts = op_counts(out)
    assert counts["Add"] == 1 and counts["Conv"] == convs_after
    assert counts["BatchNormalization"] == 0  # each branch's own Conv + BN still folds
    assert max_rel(proto, out) <= 1e-5
    return reason


def test_branch_output_with_extra_consumer_is_not_merged():
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,8,8] x, float[4,4,3,3] w3, float[4,4,1,1] w1, {_bn_inputs(4, 3, 1)})
            => (float[1,4,8,8] y, float[1,4,8,8] z) {{
            c3 = Conv <pads = [1,1,1,1]> (x, w3)
            n3 = BatchNormalization (c3, s3, b3, m3, var3)
            c1 = Conv (x, w1)
            n1 = BatchNormalization (c1, s1, b1, m1, var1)
            a = Add (n3, n1)
            y = Relu (a)
            z = Sigmoid (n1)
        }}""")
    reason = _assert_unmerged(proto, "has another consumer", convs_after=2)
    assert "'n1'" in reason and "Sigmoid" in reason


def test_branch_value_that_is_a_graph_output_is_not_merged():
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,8,8] x, float[4,4,3,3] w3, float[4,4,1,1] w1, {_bn_inputs(4, 3, 1)})
            => (float[1,4,8,8] y, float[1,4,8,8] n1) {{
            c3 = Conv <pads = [1,1,1,1]> (x, w3)
            n3 = BatchNormalization (c3, s3, b3, m3, var3)
            c1 = Conv (x, w1)
            n1 = BatchNormalization (c1, s1, b1, m1, var1)
            a = Add (n3, n1)
            y = Relu (a)
        }}""")
    assert "'n1'" in _assert_unmerged(proto, "is a graph output", convs_after=2)


def test_branches_with_different_strides_are_not_merged():
    """1x1 stride 2 and 4x4 stride 1 both give 4x4 on a 7x7 input, but are not one convolution."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,7,7] x, float[4,4,4,4] wa, float[4,4,1,1] wb, {_bn_inputs(4, 1, 2)})
            => (float[1,4,4,4] y) {{
            ca = Conv (x, wa)
            na = BatchNormalization (ca, s1, b1, m1, var1)
            cb = Conv <strides = [2,2]> (x, wb)
            nb = BatchNormalization (cb, s2, b2, m2, var2)
            a = Add (na, nb)
            y = Relu (a)
        }}""")
    _assert_unmerged(proto, "different strides", convs_after=2)


def test_padding_that_does_not_line_up_is_not_merged():
    """Two 3x3 kernels with pads [1,1,1,1] and [0,0,2,2]: same output size, windows shifted by one."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,8,8] x, float[4,4,3,3] wa, float[4,4,3,3] wb, {_bn_inputs(4, 1, 2)})
            => (float[1,4,8,8] y) {{
            ca = Conv <pads = [1,1,1,1]> (x, wa)
            na = BatchNormalization (ca, s1, b1, m1, var1)
            cb = Conv <pads = [0,0,2,2]> (x, wb)
            nb = BatchNormalization (cb, s2, b2, m2, var2)
            a = Add (na, nb)
            y = Relu (a)
        }}""")
    _assert_unmerged(proto, "padding does not line up", convs_after=2)


def test_depthwise_plus_dense_branch_is_not_merged():
    """A depthwise 3x3 and a dense 1x1: one merged kernel would be dense 3x3 (slower), so no."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,8,8] x, float[4,1,3,3] wa, float[4,4,1,1] wb, {_bn_inputs(4, 1, 2)})
            => (float[1,4,8,8] y) {{
            ca = Conv <pads = [1,1,1,1], group = 4> (x, wa)
            na = BatchNormalization (ca, s1, b1, m1, var1)
            cb = Conv (x, wb)
            nb = BatchNormalization (cb, s2, b2, m2, var2)
            a = Add (na, nb)
            y = Relu (a)
        }}""")
    _assert_unmerged(proto, "different groups", convs_after=2)


def test_sequential_kxk_kxk_branch_is_not_merged():
    """3x3 -> 3x3 in one branch is not a single 3x3 convolution."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,8,8] x, float[4,4,3,3] wa, float[4,4,3,3] wb, float[4,4,1,1] wc,
           {_bn_inputs(4, 1, 2)}) => (float[1,4,8,8] y) {{
            ca = Conv <pads = [1,1,1,1]> (x, wa)
            cb = Conv <pads = [1,1,1,1]> (ca, wb)
            nb = BatchNormalization (cb, s1, b1, m1, var1)
            cc = Conv (x, wc)
            nc = BatchNormalization (cc, s2, b2, m2, var2)
            a = Add (nb, nc)
            y = Relu (a)
        }}""")
    _assert_unmerged(proto, "neither is a 1x1", convs_after=3)


def test_bias_before_padded_conv_is_not_merged():
    """1x1 conv -> BN (bias) -> padded 3x3: zero padding of a biased tensor is not a Conv of x (DBB
    pads before the BN for this reason); the branch stays, the rest folds."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,8,8] x, float[4,4,1,1] wa, float[4,4,3,3] wb, float[4,4,3,3] wc,
           {_bn_inputs(4, 1, 2)}) => (float[1,4,8,8] y) {{
            ca = Conv (x, wa)
            na = BatchNormalization (ca, s1, b1, m1, var1)
            cb = Conv <pads = [1,1,1,1]> (na, wb)
            cc = Conv <pads = [1,1,1,1]> (x, wc)
            nc = BatchNormalization (cc, s2, b2, m2, var2)
            a = Add (cb, nc)
            y = Relu (a)
        }}""")
    _assert_unmerged(proto, "zero-pads a tensor that has a bias", convs_after=3)


def test_reparam_alias_runs_before_fuse_on_repvgg():
    from reparam_export import timm_export

    assert expand_alias("reparam") == ["reparam-branches", "dce"]
    path = timm_export("repvgg_a0")
    out, result = run_reparam(path, "cleanup,reparam,fuse")
    names = [r.name for r in result.records]
    assert names.index("reparam-branches") < names.index("fuse-conv-bn")
    assert op_counts(out)["BatchNormalization"] == 0
    assert max_rel(path, out) <= 1e-4


def test_bn_before_unpadded_conv_folds_into_its_input_side():
    """BN -> Conv 1x1 (no padding): W'[o, c] = W[o, c] * s[c], b' = b + sum_c W[o, c] * t[c]."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,6,6] x, float[8,4,1,1] w, float[8] wb, {_bn_inputs(4, 1)}) => (float[1,8,6,6] y) {{
            n = BatchNormalization (x, s1, b1, m1, var1)
            y = Conv (n, w, wb)
        }}""")
    out, result = run_reparam(proto)
    assert op_counts(out) == {"Conv": 1}
    assert reparam_stats(result)["folded"] == 1
    inits, got = _inits(proto), _inits(out)
    s, t = _fold(inits, 1)
    conv = out.graph.node[0]
    np.testing.assert_allclose(got[conv.input[1]], inits["w"] * s[None, :, None, None], rtol=1e-6)
    np.testing.assert_allclose(got[conv.input[2]], inits["wb"] + inits["w"][:, :, 0, 0] @ t, rtol=1e-6)
    assert max_rel(proto, out) <= 1e-5


def test_bn_before_padded_conv_stays():
    """BN -> Conv 3x3 with padding: the padded border would see BN(0) = t, not 0; nothing folds."""
    proto = parsed_with_weights(HEADER + f"""
        g (float[1,4,6,6] x, float[8,4,3,3] w, {_bn_inputs(4, 1)}) => (float[1,8,6,6] y) {{
            n = BatchNormalization (x, s1, b1, m1, var1)
            y = Conv <pads = [1,1,1,1]> (n, w)
        }}""")
    out, result = run_reparam(proto)
    assert op_counts(out) == {"BatchNormalization": 1, "Conv": 1}
    assert not next(r for r in result.records if r.name == "reparam-branches").modified
    assert max_rel(proto, out) == 0.0


def test_explicit_pad_before_conv_becomes_conv_padding():
    """Pad(0) -> Conv (pads 0) is one Conv with the Pad's (asymmetric) padding."""
    proto = parsed_with_weights(HEADER + """
        g (float[1,4,6,6] x, float[8,4,3,3] w) => (float[1,8,7,5] y) {
            pads = Constant <value = int64[8] {0,0,2,0,0,0,1,1}> ()
            p = Pad (x, pads)
            y = Conv (p, w)
        }""")
    out, result = run_reparam(proto)
    assert op_counts(out) == {"Conv": 1}
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in out.graph.node[0].attribute}
    assert attrs["pads"] == [2, 0, 1, 1]
    assert max_rel(proto, out) <= 1e-6
