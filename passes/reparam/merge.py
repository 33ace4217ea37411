"""Kernel arithmetic of structural re-parameterization: compose, align and sum 2-D convolution branches."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Sequence, Tuple

import numpy as np

from passctl.passes.fusion.bn_math import fold_scale_shift_into_conv_weights

# Sources of the math (all exact identities of linear maps; no approximation):
# - RepVGG (Ding et al., CVPR 2021, "RepVGG: Making VGG-style ConvNets Great Again", Sec. 3.3):
#   BN folded into each branch, the 1x1 kernel zero-padded to kxk at the centre, identity as a
#   one-hot kxk kernel (group-aware), kernels and biases summed.
# - ACNet (Ding et al., ICCV 2019, "ACNet: Strengthening the Kernel Skeletons", Sec. 3.4): 1xk and
#   kx1 kernels added onto the centre row / column of the kxk kernel ("branch fusion").
# - DBB (Ding et al., CVPR 2021, "Diverse Branch Block", Sec. 3.2): transform II (1x1 conv then kxk
#   conv is one kxk conv; the intermediate must be padded with the first stage's bias, which the
#   graph form Pad(0) -> BatchNormalization provides), transform V (average pooling as a kxk conv
#   with weight 1/k^2 on the channel diagonal).
# - MobileOne (Vasu et al., CVPR 2023, "MobileOne: An Improved One millisecond Mobile Backbone",
#   Sec. 3): k over-parameterized kxk branches, a 1x1 "scale" branch and a BN identity branch summed.


class MergeError(ValueError):
    """Two branches (or a branch and the op after it) cannot be written as one convolution; the
    message says why, for the pass statistics."""


@dataclass
class Kernel:
    """A 2-D convolution ``y = conv(x, weight, group, strides, pads, dilations) + bias`` of one source.

    Attributes:
        weight: float64 ``[C_out, C_in / group, kh, kw]`` (ONNX Conv layout).
        bias: float64 ``[C_out]``.
        group: the Conv ``group``.
        strides, dilations: ``(h, w)``.
        pads: ``(top, left, bottom, right)`` in input pixels (ONNX ``pads`` order).
        diag: the weight only maps input channel ``c`` to output channel ``c`` (identity,
            BatchNormalization alone, average pooling), so it may be regrouped to any group count.
            Such a kernel is stored depthwise (``group == C_out == C_in``).
        convs: how many Conv nodes were folded into it (0: built from BN / pooling / identity only).
    """

    weight: np.ndarray
    bias: np.ndarray
    group: int
    strides: Tuple[int, int] = (1, 1)
    pads: Tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: Tuple[int, int] = (1, 1)
    diag: bool = False
    convs: int = 0

    @property
    def c_out(self) -> int:
        return self.weight.shape[0]

    @property
    def c_in(self) -> int:
        return self.weight.shape[1] * self.group

    @property
    def ksize(self) -> Tuple[int, int]:
        return self.weight.shape[2], self.weight.shape[3]

    def is_pointwise(self) -> bool:
        """A 1x1 kernel with stride 1 (padding allowed: it commutes with a bias-free 1x1 map)."""
        return self.ksize == (1, 1) and self.strides == (1, 1)

    def describe(self) -> str:
        kh, kw = self.ksize
        return (f"{kh}x{kw} kernel (strides {list(self.strides)}, pads {list(self.pads)}, "
                f"dilations {list(self.dilations)}, group {self.group})")


def diagonal(scale: np.ndarray, bias: np.ndarray, ksize: Tuple[int, int] = (1, 1), **spatial) -> Kernel:
    """A per-channel kernel: ``y[c] = scale[c] * (x[c] window-summed over ksize) + bias[c]``.

    Args:
        scale: ``[C]`` (1 for the identity branch; the BN scale ``s``; ``1 / (kh * kw)`` for pooling).
        bias: ``[C]``.
        ksize: ``(kh, kw)``; every tap of the window gets ``scale[c]``.
        **spatial: ``strides``, ``pads``, ``dilations`` of :class:`Kernel`.
    """
    scale = np.asarray(scale, np.float64).reshape(-1)
    c = scale.size
    weight = np.broadcast_to(scale.reshape(c, 1, 1, 1), (c, 1) + tuple(ksize)).copy()
    return Kernel(weight, np.asarray(bias, np.float64).reshape(-1).copy(), c, diag=True, **spatial)


def affine(k: Kernel, s: np.ndarray, t: np.ndarray) -> Kernel:
    """``s * k(x) + t`` per output channel: the single-branch fold shared with ``fuse-conv-bn``
    (:func:`passctl.passes.fusion.bn_math.fold_scale_shift_into_conv_weights`)."""
    w, b = fold_scale_shift_into_conv_weights(k.weight, k.bias, s, t, group=k.group)
    return replace(k, weight=w, bias=b)


def to_group(k: Kernel, group: int) -> np.ndarray:
    """``k.weight`` rewritten for ``group`` groups (``[C_out, C_in / group, kh, kw]``).

    A diagonal kernel goes to any group (its one tap per channel lands at ``c % (C_in / group)``,
    the RepVGG identity kernel); a grouped kernel goes to a group count dividing its own (coarser
    groups, the extra entries zero).

    Raises:
        MergeError: the kernel is not expressible with ``group`` groups.
    """
    if group == k.group:
        return k.weight
    c_out, c_in = k.c_out, k.c_in
    if c_in % group or c_out % group:
        raise MergeError(f"{c_in} input / {c_out} output channels are not divisible by group {group}")
    if not k.diag and k.group % group:
        raise MergeError(f"a group-{k.group} kernel cannot be written with group {group}")
    per_in, per_out_src, per_in_src = c_in // group, c_out // k.group, c_in // k.group
    out = np.zeros((c_out, per_in) + k.ksize, np.float64)
    for o in range(c_out):
        first_in = (o // per_out_src) * per_in_src  # first input channel of o's source group
        local = first_in - (o // (c_out // group)) * per_in
        out[o, local:local + per_in_src] = k.weight[o]
    return out


def _align_dim(ka: int, pa: int, ea: int, da: int, kb: int, pb: int, eb: int, db: int):
    """One spatial axis of two branches: the merged ``(K, P, E, D)`` and each branch's tap offset.

    A branch reads ``x[s*i - p + d*j]`` for ``j < k``; both must read taps of one dilated window
    that contains the other's (RepVGG / ACNet: the small kernel sits inside the kxk one).
    """
    da = da if ka > 1 else None
    db = db if kb > 1 else None
    if da is not None and db is not None and da != db:
        raise MergeError(f"dilations differ ({da} vs {db})")
    d = da or db or 1
    total_a, total_b = pa + ea - d * (ka - 1), pb + eb - d * (kb - 1)
    if total_a != total_b:
        raise MergeError(f"padding does not line up: pads ({pa}, {ea}) with a {ka}-tap kernel and "
                         f"({pb}, {eb}) with a {kb}-tap kernel give different output sizes")
    first_a, first_b = -pa, -pb
    last_a, last_b = first_a + d * (ka - 1), first_b + d * (kb - 1)
    if not ((first_a <= first_b and last_a >= last_b) or (first_b <= first_a and last_b >= last_a)):
        raise MergeError(f"padding does not line up: the {ka}-tap window with pad {pa} and the "
                         f"{kb}-tap window with pad {pb} are shifted against each other")
    first = min(first_a, first_b)
    if (first_a - first) % d or (first_b - first) % d:
        raise MergeError(f"padding does not line up: pads {pa} and {pb} differ by a non-multiple "
                         f"of the dilation {d}")
    big = (max(last_a, last_b) - first) // d + 1
    pad = -first
    end = total_a + d * (big - 1) - pad
    return big, pad, end, d, (first_a - first) // d, (first_b - first) // d


def add(a: Kernel, b: Kernel) -> Kernel:
    """The branch sum ``a(x) + b(x)`` as one kernel: kernels zero-padded to the common window at
    their offsets (RepVGG 1x1 at the centre, ACNet 1xk / kx1 on the centre row / column), biases
    added.

    Raises:
        MergeError: channel counts, strides, dilations, padding or groups are incompatible.
    """
    if (a.c_out, a.c_in) != (b.c_out, b.c_in):
        raise MergeError(f"branches map {a.c_in}->{a.c_out} and {b.c_in}->{b.c_out} channels")
    if a.strides != b.strides:
        raise MergeError(f"branches have different strides ({list(a.strides)} vs {list(b.strides)})")
    dims = [_align_dim(a.ksize[i], a.pads[i], a.pads[i + 2], a.dilations[i],
                       b.ksize[i], b.pads[i], b.pads[i + 2], b.dilations[i]) for i in range(2)]
    if a.diag and b.diag:
        group = a.group
    elif a.diag or b.diag:
        group = b.group if a.diag else a.group
    elif a.group != b.group:
        raise MergeError(f"branches have different groups ({a.group} vs {b.group}); merging would "
                         "make a denser, slower kernel")
    else:
        group = a.group
    (kh, ph, eh, dh, ah, bh), (kw, pw, ew, dw, aw, bw) = dims
    weight = np.zeros((a.c_out, a.c_in // group, kh, kw), np.float64)
    for k, oh, ow in ((a, ah, aw), (b, bh, bw)):
        w = to_group(k, group)
        weight[:, :, oh:oh + k.ksize[0], ow:ow + k.ksize[1]] += w
    return Kernel(weight, a.bias + b.bias, group, a.strides, (ph, pw, eh, ew), (dh, dw),
                  a.diag and b.diag, a.convs + b.convs)


def compose(first: Kernel, second: Kernel) -> Kernel:
    """``second(first(x))`` as one kernel, when one of them is pointwise (DBB transform II; a BN or
    per-channel constant before a convolution; average pooling after a 1x1 conv).

    Rules: ``second`` 1x1 with stride 1 and no padding takes ``first``'s window; otherwise ``first``
    must be pointwise (1x1, stride 1) and its padding adds to ``second``'s. When ``second`` pads,
    ``first``'s bias would be padded with zeros instead of its value, so ``first`` must have no bias
    (DBB writes the padding before the BN: Pad(0) -> BatchNormalization).

    Raises:
        MergeError: neither is pointwise, the bias would cross a zero padding, or the groups differ.
    """
    if first.c_out != second.c_in:
        raise MergeError(f"{first.c_out} channels feed a kernel expecting {second.c_in}")
    second_pointwise = second.is_pointwise() and second.pads == (0, 0, 0, 0)
    if not second_pointwise:
        if not first.is_pointwise():
            raise MergeError(f"a {second.describe()} after a {first.describe()}: neither is a 1x1 "
                             "stride-1 map, so they are not one convolution")
        if any(second.pads) and np.any(first.bias != 0):
            raise MergeError(f"the {second.describe()} zero-pads a tensor that has a bias; write the "
                             "padding before the bias (Pad -> BatchNormalization, as DBB does)")
    ws, wf = second.weight, first.weight
    if first.diag:  # y[o] = sum_j ws[o, j] * wf[c(o, j)]: scale ws's input channels
        group, diag = second.group, second.diag
        per_o, per_j = second.c_out // group, second.c_in // group
        chan = (np.arange(second.c_out)[:, None] // per_o) * per_j + np.arange(per_j)[None, :]
        weight = _outer(ws, wf[chan, 0])
    elif second.diag:  # y[o] = ws[o, 0] * wf[o]
        group, diag = first.group, first.diag
        weight = _outer(ws[:, :1], wf)
    else:
        if first.group != second.group:
            raise MergeError(f"a group-{second.group} conv after a group-{first.group} conv")
        group, diag = first.group, False
        g = group
        a = ws.reshape((g, ws.shape[0] // g) + ws.shape[1:])          # [g, O/g, D/g, kh, kw]
        f = wf.reshape((g, wf.shape[0] // g) + wf.shape[1:])          # [g, D/g, C/g, kh, kw]
        if second.ksize == (1, 1):
            weight = np.einsum("goj,gjcxy->gocxy", a[..., 0, 0], f)
        else:
            weight = np.einsum("gojxy,gjc->gocxy", a, f[..., 0, 0])
        weight = weight.reshape((second.c_out,) + weight.shape[2:])
    bias = second.bias + _bias_through(second, first.bias)
    if second_pointwise:
        spatial = dict(strides=first.strides, pads=first.pads, dilations=first.dilations)
    else:
        pads = tuple(p + q for p, q in zip(first.pads, second.pads))
        spatial = dict(strides=second.strides, pads=pads, dilations=second.dilations)
    return Kernel(weight, bias, group, diag=diag, convs=first.convs + second.convs, **spatial)


def _outer(ws: np.ndarray, wf: np.ndarray) -> np.ndarray:
    """Per (o, j) entry, the product of two spatial kernels of which one is 1x1."""
    if ws.shape[-2:] == (1, 1):
        return ws * wf
    return ws * wf[..., :1, :1] if wf.shape[-2:] == (1, 1) else ws * wf


def _bias_through(k: Kernel, bias: np.ndarray) -> np.ndarray:
    """``k`` applied to a constant image of value ``bias[c]`` (no padding reached): per output
    channel, the sum of its taps times the bias of their input channel."""
    if not np.any(bias):
        return np.zeros(k.c_out)
    taps = k.weight.sum(axis=(2, 3))                                  # [O, C/g]
    per_o, per_j = k.c_out // k.group, k.c_in // k.group
    chan = (np.arange(k.c_out)[:, None] // per_o) * per_j + np.arange(per_j)[None, :]
    return (taps * bias[chan]).sum(axis=1)


def sum_kernels(kernels: Sequence[Kernel]) -> Kernel:
    """:func:`add` over a list (the branches of one Add chain), left to right."""
    total = kernels[0]
    for k in kernels[1:]:
        total = add(total, k)
    return total


def kernel_attributes(k: Kernel) -> dict:
    """The ONNX Conv attributes of ``k``."""
    return dict(kernel_shape=list(k.ksize), strides=list(k.strides), pads=list(k.pads),
                dilations=list(k.dilations), group=k.group)


__all__: List[str] = ["Kernel", "MergeError", "add", "affine", "compose", "diagonal",
                      "kernel_attributes", "sum_kernels", "to_group"]
