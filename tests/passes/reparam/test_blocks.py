"""ACNet and DBB blocks written as torch modules, exported with BN kept, merged by `reparam` into one Conv."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch
from reparam_helpers import export_block, max_rel, op_counts, reparam_stats, run_reparam

nn, F = torch.nn, torch.nn.functional


def _conv_bn(c_in, c_out, kernel, stride=1, padding=0, groups=1, dilation=1):
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, padding, dilation, groups, bias=False),
                         nn.BatchNorm2d(c_out))  # epsilon set per BN by export_block


class ACBlock(nn.Module):
    """ACNet (Ding et al. 2019): kxk + 1xk + kx1 conv-BN branches summed, then ReLU."""

    def __init__(self, c_in, c_out, k=3, stride=1, groups=1, dilation=1):
        super().__init__()
        p = dilation * (k // 2)
        self.square = _conv_bn(c_in, c_out, (k, k), stride, p, groups, dilation)
        self.hor = _conv_bn(c_in, c_out, (1, k), stride, (0, p), groups, dilation)
        self.ver = _conv_bn(c_in, c_out, (k, 1), stride, (p, 0), groups, dilation)

    def forward(self, x):
        return F.relu(self.square(x) + self.hor(x) + self.ver(x))


class DBBlock(nn.Module):
    """Diverse Branch Block (Ding et al. 2021): kxk, 1x1, 1x1 -> avg and 1x1 -> kxk branches.

    DBB's BNAndPadLayer pads a BN output with the BN's own bias; that equals zero padding followed
    by the BN (BN(0) is the bias), which is how it is written here: ``bn(F.pad(conv1x1(x)))``. For a
    depthwise block (groups == channels) the average-pool branch is AvgPool -> BN on x directly, as
    in DBB.
    """

    def __init__(self, c_in, c_out, k=3, stride=1, groups=1):
        super().__init__()
        self.p = p = k // 2
        self.depthwise = groups == c_in == c_out
        self.origin = _conv_bn(c_in, c_out, k, stride, p, groups)
        self.one = None if self.depthwise else _conv_bn(c_in, c_out, 1, stride, 0, groups)
        if self.depthwise:
            self.avg = nn.AvgPool2d(k, stride, padding=p)  # count_include_pad=True
        else:
            self.avg_conv = nn.Conv2d(c_in, c_out, 1, 1, 0, groups=groups, bias=False)
            self.avg_pad_bn = nn.BatchNorm2d(c_out)
            self.avg = nn.AvgPool2d(k, stride, padding=0)
        self.avg_bn = nn.BatchNorm2d(c_out)
        self.id_conv = nn.Conv2d(c_in, c_in, 1, 1, 0, groups=groups, bias=False)
        self.id_pad_bn = nn.BatchNorm2d(c_in)
        self.kxk = nn.Conv2d(c_in, c_out, k, stride, 0, groups=groups, bias=False)
        self.kxk_bn = nn.BatchNorm2d(c_out)

    def forward(self, x):
        pad = [self.p] * 4
        out = self.origin(x)
        if self.one is not None:
            out = out + self.one(x)
            out = out + self.avg_bn(self.avg(self.avg_pad_bn(F.pad(self.avg_conv(x), pad))))
        else:
            out = out + self.avg_bn(self.avg(x))
        out = out + self.kxk_bn(self.kxk(self.id_pad_bn(F.pad(self.id_conv(x), pad))))
        return F.relu(out)


def _conv_weights(proto):
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    return inits[conv.input[1]], inits[conv.input[2]], attrs


def _assert_one_conv(path, out, result, branches):
    before, after = op_counts(path), op_counts(out)
    assert before["Conv"] >= 2 and before["BatchNormalization"] >= 2
    assert after["Conv"] == 1 and after["BatchNormalization"] == 0 and after["Add"] == 0
    assert after["Pad"] == 0 and after["AveragePool"] == 0
    stats = reparam_stats(result)
    assert stats["merged"] == 1 and stats["branches"] == branches and "unmerged" not in stats
    assert max_rel(path, out) <= 1e-4


@pytest.mark.parametrize("c_in,c_out,k,stride,groups,dilation", [
    (8, 8, 3, 1, 1, 1), (8, 16, 3, 2, 2, 1), (8, 8, 3, 1, 8, 1), (8, 8, 5, 1, 1, 1),
    (8, 8, 3, 1, 1, 2)], ids=["3x3", "stride2-group2", "depthwise", "5x5", "dilation2"])
def test_acnet_block_is_one_conv(tmp_path, c_in, c_out, k, stride, groups, dilation):
    block = ACBlock(c_in, c_out, k, stride, groups, dilation)
    path = export_block(block, tmp_path / "acnet.onnx", shape=(1, c_in, 13, 13))
    out, result = run_reparam(path)
    _assert_one_conv(path, out, result, branches=3)
    # Independent expectation (ACNet Sec. 3.4): each BN folded with its own epsilon, the 1xk kernel
    # added onto the centre row and the kx1 kernel onto the centre column of the kxk kernel.
    expected_w, expected_b = np.zeros((c_out, c_in // groups, k, k)), np.zeros(c_out)
    for branch, rows, cols in ((block.square, slice(None), slice(None)),
                               (block.hor, slice(k // 2, k // 2 + 1), slice(None)),
                               (block.ver, slice(None), slice(k // 2, k // 2 + 1))):
        conv, bn = branch
        s = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().double().numpy()
        expected_w[:, :, rows, cols] += conv.weight.detach().double().numpy() * s[:, None, None, None]
        expected_b += bn.bias.detach().double().numpy() - bn.running_mean.double().numpy() * s
    w, b, attrs = _conv_weights(out)
    np.testing.assert_allclose(w, expected_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, expected_b, rtol=1e-5, atol=1e-6)
    p = dilation * (k // 2)
    assert attrs["kernel_shape"] == [k, k] and attrs["pads"] == [p] * 4
    assert attrs["strides"] == [stride] * 2 and attrs["group"] == groups
    assert attrs["dilations"] == [dilation] * 2


@pytest.mark.parametrize("c_in,c_out,k,stride,groups", [
    (8, 8, 3, 1, 1), (8, 16, 3, 2, 1), (8, 8, 3, 1, 2), (8, 8, 5, 1, 1), (8, 8, 3, 1, 8),
    (8, 8, 3, 2, 8)], ids=["3x3", "stride2", "group2", "5x5", "depthwise", "depthwise-stride2"])
def test_dbb_block_is_one_conv(tmp_path, c_in, c_out, k, stride, groups):
    block = DBBlock(c_in, c_out, k, stride, groups)
    path = export_block(block, tmp_path / "dbb.onnx", shape=(1, c_in, 13, 13))
    out, result = run_reparam(path)
    _assert_one_conv(path, out, result, branches=3 if block.depthwise else 4)
    w, _, attrs = _conv_weights(out)
    assert w.shape == (c_out, c_in // groups, k, k)
    assert attrs["pads"] == [k // 2] * 4 and attrs["strides"] == [stride] * 2
    assert attrs["group"] == groups
