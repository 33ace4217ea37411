"""fuse-conv-bn: exact folded weights (numpy, independently), numerics vs ONNX Runtime, PP-OCR cls."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from helpers import apply, assert_same_outputs, op_types, parse

from corpus import CORPUS
from passctl.ir import from_onnx, load, to_onnx
from passctl.passes.common.fold_constants import FoldConstants
from passctl.passes.fusion.bn_math import fold_bn_into_conv_weights
from passctl.passes.fusion.fold_batchnorm import FuseConvBatchNorm
from passctl.passes.rewrite import explain
from passctl.support.check import check_models


def _with_initializers(proto: onnx.ModelProto, arrays) -> onnx.ModelProto:
    for name, arr in arrays.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _bn_params(rng, c):
    """Non-unit BN statistics: scale, B, mean, var (var in [0.5, 2])."""
    return (rng.uniform(0.5, 2.0, c).astype(np.float32), rng.normal(size=c).astype(np.float32),
            rng.normal(size=c).astype(np.float32), rng.uniform(0.5, 2.0, c).astype(np.float32))


def _init(proto, name):
    return next(onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.name == name)


def _conv_weight_and_bias(proto):
    conv = next(n for n in proto.graph.node if n.op_type in ("Conv", "ConvTranspose"))
    return _init(proto, conv.input[1]), _init(proto, conv.input[2]), conv


def test_epsilon_1e3_non_unit_statistics():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 3, 3, 3)).astype(np.float32)
    b = rng.normal(size=8).astype(np.float32)
    scale, beta, mean, var = _bn_params(rng, 8)
    proto = _with_initializers(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,10,10] x) => (float[1,8,10,10] y) {
            c = Conv <pads = [1,1,1,1]> (x, w, b)
            y = BatchNormalization <epsilon = 0.001> (c, scale, beta, mean, var)
        }""", check=False), dict(w=w, b=b, scale=scale, beta=beta, mean=mean, var=var))
    model, result, out = apply(proto, FuseConvBatchNorm())
    assert result.stats == {"fused": 1, "fold-conv-bias-bn": 1}
    assert op_types(out) == ["Conv"]
    assert out.graph.output[0].name == "y" and out.graph.node[0].output[0] == "y"
    # Independent expectation: y = (conv(x) + b - mean) * scale / sqrt(var + 1e-3) + beta.
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-3)
    expected_w = (w.astype(np.float64) * s[:, None, None, None]).astype(np.float32)
    expected_b = ((b - mean.astype(np.float64)) * s + beta).astype(np.float32)
    new_w, new_b, _ = _conv_weight_and_bias(out)
    np.testing.assert_array_equal(new_w, expected_w)
    np.testing.assert_array_equal(new_b, expected_b)
    # epsilon 1e-5 (the default) would give a visibly different weight: the BN's own epsilon is used.
    assert not np.allclose(new_w, w * (scale / np.sqrt(var + 1e-5))[:, None, None, None], rtol=1e-6)
    assert_same_outputs(proto, out)


def test_shared_weight_batchnorm_on_one_path_only():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(4, 4, 1, 1)).astype(np.float32)
    scale, beta, mean, var = _bn_params(rng, 4)
    proto = _with_initializers(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,6,6] x) => (float[1,4,6,6] y1, float[1,4,6,6] y2) {
            c1 = Conv (x, w)
            y1 = BatchNormalization (c1, scale, beta, mean, var)
            y2 = Conv (x, w)
        }""", check=False), dict(w=w, scale=scale, beta=beta, mean=mean, var=var))
    model, result, out = apply(proto, FuseConvBatchNorm())
    assert result.stats == {"fused": 1, "fold-conv-bn": 1}
    assert "BatchNormalization" not in op_types(out)
    convs = {n.output[0]: n for n in out.graph.node}
    # The unfused path still reads the original weight, whose bytes are untouched.
    assert convs["y2"].input[1] == "w"
    np.testing.assert_array_equal(_init(out, "w"), w)
    # The fused path reads a new initializer with the folded values (epsilon 1e-5, no Conv bias).
    assert convs["y1"].input[1] != "w"
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-5)
    np.testing.assert_array_equal(_init(out, convs["y1"].input[1]),
                                  (w * s[:, None, None, None]).astype(np.float32))
    np.testing.assert_array_equal(_init(out, convs["y1"].input[2]),
                                  (beta - mean * s).astype(np.float32))
    assert_same_outputs(proto, out)


def test_conv_transpose_group2_cin_ne_cout():
    rng = np.random.default_rng(2)
    c_in, c_out, group = 4, 6, 2
    w = rng.normal(size=(c_in, c_out // group, 3, 3)).astype(np.float32)  # [C_in, C_out/group, k, k]
    b = rng.normal(size=c_out).astype(np.float32)
    scale, beta, mean, var = _bn_params(rng, c_out)
    proto = _with_initializers(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,5,5] x) => (float[1,6,11,11] y) {
            c = ConvTranspose <group = 2, strides = [2,2]> (x, w, b)
            y = BatchNormalization <epsilon = 0.001> (c, scale, beta, mean, var)
        }""", check=False), dict(w=w, b=b, scale=scale, beta=beta, mean=mean, var=var))
    model, result, out = apply(proto, FuseConvBatchNorm())
    assert result.stats == {"fused": 1, "fold-conv-transpose-bias-bn": 1}
    new_w, new_b, conv = _conv_weight_and_bias(out)
    assert conv.op_type == "ConvTranspose"
    # Expected weights channel by channel: output channel o = g*(C_out/group) + j lives in
    # W[g*(C_in/group):(g+1)*(C_in/group), j].
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-3)
    expected = w.astype(np.float64).copy()
    cin_g, cout_g = c_in // group, c_out // group
    for o in range(c_out):
        g, j = divmod(o, cout_g)
        expected[g * cin_g:(g + 1) * cin_g, j] *= s[o]
    np.testing.assert_array_equal(new_w, expected.astype(np.float32))
    np.testing.assert_array_equal(new_b, ((b - mean.astype(np.float64)) * s + beta).astype(np.float32))
    assert_same_outputs(proto, out)


def test_not_folded_when_conv_output_has_another_consumer():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(2, 2, 1, 1)).astype(np.float32)
    scale, beta, mean, var = _bn_params(rng, 2)
    proto = _with_initializers(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,2,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z) {
            c = Conv (x, w)
            y = BatchNormalization (c, scale, beta, mean, var)
            z = Relu (c)
        }""", check=False), dict(w=w, scale=scale, beta=beta, mean=mean, var=var))
    _, result, out = apply(proto, FuseConvBatchNorm())
    assert result.stats == {"fused": 0} and not result.modified
    assert op_types(out) == ["Conv", "BatchNormalization", "Relu"]


def test_bn_math_rejects_channel_mismatch():
    with pytest.raises(ValueError, match="channel"):
        fold_bn_into_conv_weights(np.ones((3, 2, 1, 1)), None, np.ones(4), np.zeros(4),
                                  np.zeros(4), np.ones(4), 1e-5)


def test_ppocr_cls_all_35_pairs_folded():
    entry = CORPUS["ppocr_cls"]
    model = load(entry.path)
    before = sum(n.op_type == "BatchNormalization" for n in model.graph)
    assert before == 35
    # NOTE: the Paddle export keeps weights in Constant nodes; fold-constants lifts them first.
    FoldConstants()(model)
    result = FuseConvBatchNorm()(model)
    assert result.stats["fused"] == 35
    assert not any(n.op_type == "BatchNormalization" for n in model.graph)
    check = check_models(entry.path, to_onnx(model), inputs=entry.inputs(seed=0))
    assert check.ok(1e-5), str(check)


def test_explain_says_why_a_pair_is_not_folded():
    rng = np.random.default_rng(4)
    w = rng.normal(size=(2, 2, 1, 1)).astype(np.float32)
    _, beta, mean, var = _bn_params(rng, 2)
    proto = _with_initializers(parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1,2,4,4] x, float[2] s) => (float[1,2,4,4] y) {
            c = Conv (x, w)
            y = BatchNormalization (c, s, beta, mean, var)
        }""", check=False), dict(w=w, beta=beta, mean=mean, var=var))
    model = from_onnx(proto)
    text = explain("fold-conv-bn", model)
    assert "check failed: BatchNormalization parameter 's' is not a constant" in text
    assert FuseConvBatchNorm()(model).stats == {"fused": 0}
