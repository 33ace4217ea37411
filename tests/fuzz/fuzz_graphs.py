"""Random valid opset-17 graphs over the op families passctl's passes match, for the differential
fuzzer (:mod:`fuzz_runner`).

``generate(seed, focus)`` builds one small graph from a seeded ``numpy.random.default_rng``: a chain
of 1-3 blocks (Conv/BatchNormalization/activation, RepVGG/ACNet/DBB branches, MatMul/Gemm + bias,
LayerNorm/RMSNorm spellings, GELU/SiLU/HardSwish spellings, attention with MHA/GQA heads, scale,
mask and softmax forms, constant subgraphs), each written in one of the spellings the exporters use,
with the perturbations that break passes: "scalar" constants of a higher rank ([1,1,8], [1,1,1]),
shared initializers, intermediate values that are also graph outputs, reductions over a wrong axis,
keepdims=0 + Unsqueeze, masks with fully masked rows and finite or infinite fills, K and V repeated
in different ways, NaN in the inputs. Every graph passes ``onnx.checker.check_model(full_check=True)``
and runs in ONNX Runtime at ``ORT_DISABLE_ALL`` on its feeds (``FuzzGraph.feeds``); the declared
output shapes and dtypes are those ONNX Runtime returns.

Sizes stay tiny (a few hundred elements per tensor) so one graph compiles and runs in well under a
second on one core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FOCI = ("mix", "conv", "repvgg", "linear", "norm", "act", "attention", "const")
"""Block mixes :func:`generate` can favour (``mix``: all kinds alike)."""

_F32 = np.float32


@dataclass
class FuzzGraph:
    """One generated graph.

    Attributes:
        seed: the seed it was generated from (with ``focus``, it reproduces the graph exactly).
        focus: the block mix (one of :data:`FOCI`).
        model: the ONNX model (opset 17, IR version 8).
        feeds: ``{input name: array}`` for every graph input (float32 uniform in [-1, 1), boolean
            masks with some fully masked rows, NaN at a few positions when ``"nan"`` is in ``tags``).
        tags: what the graph contains, e.g. ``["conv", "bn", "attention", "gqa:tile", "mask:where"]``.
        attention: number of attention blocks written (what ``flash-attn`` should fuse at most).
    """

    seed: int
    focus: str
    model: onnx.ModelProto
    feeds: Dict[str, np.ndarray]
    tags: List[str] = field(default_factory=list)
    attention: int = 0


class GeneratorError(Exception):
    """The generator built a graph that ONNX or ONNX Runtime refuses (a bug of the generator)."""


class _Builder:
    """Nodes, initializers, inputs and the static shape of every value built so far."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: List[onnx.NodeProto] = []
        self.inits: Dict[str, onnx.TensorProto] = {}
        self.inputs: List[onnx.ValueInfoProto] = []
        self.feeds: Dict[str, np.ndarray] = {}
        self.shape: Dict[str, Tuple[int, ...]] = {}
        self.extra_outputs: List[str] = []
        self.tags: List[str] = []
        self.attention = 0
        self._n = 0
        self.pool: Dict[Tuple, str] = {}  # shared initializers by (shape, kind)

    # -- names, constants, inputs ------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def tag(self, *tags: str) -> None:
        for t in tags:
            if t not in self.tags:
                self.tags.append(t)

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, options: Sequence):
        return options[int(self.rng.integers(len(options)))]

    def const(self, array, prefix: str = "c", share: Optional[str] = None) -> str:
        """An initializer holding ``array``; with ``share``, sometimes (shared initializers) the one
        made before for the same key and shape."""
        array = np.asarray(array)
        if share is not None:
            key = (share, array.shape, array.dtype.str)
            if key in self.pool and self.chance(0.5):
                self.tag("shared-init")
                return self.pool[key]
        name = self.fresh(prefix)
        self.inits[name] = numpy_helper.from_array(array, name)
        self.shape[name] = tuple(array.shape)
        if share is not None:
            self.pool[(share, array.shape, array.dtype.str)] = name
        return name

    def scalar(self, value: float, rank: int, last: int) -> str:
        """A "scalar" constant as exporters write it: shape [], [1], or (perturbation) [1]*rank,
        [1]*(rank+1) (broadcasts the result a rank up) or [1,..,1,last] (same value everywhere)."""
        r = self.rng.random()
        if r < 0.55:
            shape: Tuple[int, ...] = ()
        elif r < 0.7:
            shape = (1,)
        elif r < 0.8:
            shape = (1,) * rank
            self.tag("bcast-same-rank")
        elif r < 0.9:
            shape = (1,) * (rank + 1)
            self.tag("bcast-rank-up")
        else:
            shape = (1,) * max(rank - 1, 0) + (last,)
            self.tag("bcast-full-last")
        return self.const(np.full(shape, value, _F32), "k")

    def weight(self, shape, scale: Optional[float] = None, share: Optional[str] = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return self.const((self.rng.standard_normal(shape) * s).astype(_F32), "w", share=share)

    def input(self, shape, dtype=TensorProto.FLOAT, value=None, prefix: str = "x") -> str:
        name = self.fresh(prefix)
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        if value is None:
            value = self.rng.uniform(-1, 1, shape).astype(_F32)
        self.feeds[name] = value
        self.shape[name] = tuple(shape)
        return name

    # -- nodes -------------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], shape, n_out: int = 1, domain: str = "",
           **attrs) -> str:
        outs = [self.fresh(op_type.lower()[:4] + "_") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(op_type),
                                           domain=domain, **attrs))
        for o in outs:
            self.shape[o] = tuple(shape)
        return outs[0]

    def ew(self, op_type: str, a: str, b: str) -> str:
        """An elementwise binary op with numpy broadcasting of the tracked shapes."""
        shape = np.broadcast_shapes(self.shape[a], self.shape[b])
        return self.op(op_type, [a, b], shape)

    def ew_any(self, op_type: str, a: str, b: str) -> str:
        """``ew`` with the operands of a commutative op in a random order."""
        return self.ew(op_type, *((a, b) if self.chance(0.5) else (b, a)))

    def un(self, op_type: str, a: str, **attrs) -> str:
        return self.op(op_type, [a], self.shape[a], **attrs)

    def maybe_output(self, value: str, p: float = 0.12) -> None:
        """Sometimes make an intermediate value a graph output too (an extra consumer)."""
        if (self.chance(p) and value not in self.extra_outputs and value not in self.inits
                and value not in self.feeds):
            self.extra_outputs.append(value)
            self.tag("extra-output")


# -- activations -------------------------------------------------------------------------------
ACTIVATIONS = ("relu", "leaky", "sigmoid", "tanh", "silu", "hardswish", "hardsigmoid", "relu6",
               "gelu-erf", "gelu-tanh", "clip")


def activation(b: _Builder, x: str, kind: Optional[str] = None) -> str:
    """``x`` through an activation in one of its spellings (returns the output)."""
    kind = kind or b.pick(ACTIVATIONS)
    b.tag("act:" + kind)
    shape = b.shape[x]
    rank, last = len(shape), shape[-1]
    if kind == "relu":
        return b.un("Relu", x)
    if kind == "leaky":
        return b.un("LeakyRelu", x, alpha=float(b.pick([0.01, 0.1, 0.2])))
    if kind == "sigmoid":
        return b.un("Sigmoid", x)
    if kind == "tanh":
        return b.un("Tanh", x)
    if kind == "hardsigmoid":
        return b.un("HardSigmoid", x, alpha=0.2, beta=0.5)
    if kind == "silu":
        return b.ew_any("Mul", x, b.un("Sigmoid", x))
    if kind in ("relu6", "clip"):
        lo, hi = (0.0, 6.0) if kind == "relu6" else (float(b.pick([-1.0, -0.5])), float(b.pick([0.5, 1.0])))
        return b.op("Clip", [x, b.const(np.array(lo, _F32)), b.const(np.array(hi, _F32))], shape)
    if kind == "hardswish":
        form = b.pick(["op", "hardsigmoid", "clip-div", "clip-mul"])
        b.tag("hardswish:" + form)
        if form == "op":
            return b.un("HardSwish", x)
        if form == "hardsigmoid":
            return b.ew_any("Mul", x, b.un("HardSigmoid", x, alpha=1.0 / 6, beta=0.5))
        a = b.ew_any("Add", x, b.scalar(3.0, rank, last))
        c = b.op("Clip", [a, b.const(np.array(0.0, _F32)), b.const(np.array(6.0, _F32))], b.shape[a])
        m = b.ew_any("Mul", x, c)
        if form == "clip-div":
            return b.ew("Div", m, b.scalar(6.0, rank, last))
        return b.ew_any("Mul", m, b.scalar(1.0 / 6.0, rank, last))
    if kind == "gelu-erf":
        form = b.pick(["a", "b", "c"])
        b.tag("gelu-erf:" + form)
        if b.chance(0.5):
            d = b.ew("Div", x, b.scalar(float(np.sqrt(2.0)), rank, last))
        else:
            d = b.ew_any("Mul", x, b.scalar(float(1 / np.sqrt(2.0)), rank, last))
        e = b.un("Erf", d)
        a = b.ew_any("Add", e, b.scalar(1.0, rank, last))
        if form == "a":      # x * 0.5 * (1 + erf)
            return b.ew_any("Mul", b.ew_any("Mul", x, b.scalar(0.5, rank, last)), a)
        if form == "b":      # (x * (1 + erf)) * 0.5   (torch's export)
            return b.ew_any("Mul", b.ew_any("Mul", x, a), b.scalar(0.5, rank, last))
        return b.ew_any("Mul", x, b.ew_any("Mul", a, b.scalar(0.5, rank, last)))
    if kind == "gelu-tanh":
        if b.chance(0.5):
            cube = b.ew("Pow", x, b.scalar(3.0, rank, last))
        else:
            cube = b.ew("Mul", b.ew("Mul", x, x), x)
        inner = b.ew_any("Add", x, b.ew_any("Mul", cube, b.scalar(0.044715, rank, last)))
        t = b.un("Tanh", b.ew_any("Mul", inner, b.scalar(float(np.sqrt(2 / np.pi)), rank, last)))
        a = b.ew_any("Add", t, b.scalar(1.0, rank, last))
        return b.ew_any("Mul", b.ew_any("Mul", x, b.scalar(0.5, rank, last)), a)
    raise ValueError(kind)


# -- image blocks --------------------------------------------------------------------------------
def _bn(b: _Builder, x: str, c: int) -> str:
    rng = b.rng
    scale = b.const(rng.uniform(0.5, 1.5, c).astype(_F32), "bn_s", share="bn")
    bias = b.const(rng.uniform(-0.5, 0.5, c).astype(_F32), "bn_b", share="bn")
    mean = b.const(rng.uniform(-0.3, 0.3, c).astype(_F32), "bn_m", share="bn")
    var = b.const(rng.uniform(0.5, 1.5, c).astype(_F32), "bn_v", share="bn_var")
    b.tag("bn")
    return b.op("BatchNormalization", [x, scale, bias, mean, var], b.shape[x],
                epsilon=float(b.pick([1e-5, 1e-3])))


def _conv(b: _Builder, x: str, cout: int, k: Tuple[int, int], pads, group: int = 1,
          bias: bool = False, stride: int = 1, dilation: int = 1, share: Optional[str] = None) -> str:
    n, cin, h, w = b.shape[x]
    wt = b.weight((cout, cin // group, k[0], k[1]), share=share)
    ins = [x, wt] + ([b.const(b.rng.uniform(-0.3, 0.3, cout).astype(_F32), "cb")] if bias else [])
    ho = (h + pads[0] + pads[2] - dilation * (k[0] - 1) - 1) // stride + 1
    wo = (w + pads[1] + pads[3] - dilation * (k[1] - 1) - 1) // stride + 1
    b.tag("conv")
    return b.op("Conv", ins, (n, cout, ho, wo), kernel_shape=list(k), pads=list(pads),
                strides=[stride, stride], dilations=[dilation, dilation], group=group)


def conv_block(b: _Builder, x: str) -> str:
    """Conv (+bias) (+BatchNormalization) (+activation) (+residual Add)."""
    n, c, h, w = b.shape[x]
    cout = int(b.pick([c, c, 2 * c, 4]))
    k = b.pick([1, 3])
    group = c if (cout == c and k == 3 and b.chance(0.3)) else 1
    if group > 1:
        b.tag("depthwise")
    stride = 2 if (b.chance(0.15) and h >= 4) else 1
    y = _conv(b, x, cout, (k, k), [k // 2] * 4, group=group, bias=b.chance(0.5), stride=stride,
              dilation=1, share="convw")
    if b.chance(0.7):
        y = _bn(b, y, cout)
        b.maybe_output(y, 0.15)
    if b.chance(0.7):
        y = activation(b, y)
    if b.chance(0.1) and len(b.shape[y]) == 4:  # 2x upsampling ConvTranspose (decoders)
        n, c2, h2, w2 = b.shape[y]
        wt = b.weight((c2, int(b.pick([c2, 4])), 2, 2))
        cout2 = b.shape[wt][1]
        ins = [y, wt] + ([b.const(b.rng.uniform(-0.3, 0.3, cout2).astype(_F32), "tb")]
                         if b.chance(0.5) else [])
        y = b.op("ConvTranspose", ins, (n, cout2, 2 * h2, 2 * w2), kernel_shape=[2, 2],
                 strides=[2, 2])
        b.tag("conv-transpose")
        if b.chance(0.5):
            y = _bn(b, y, cout2)
    if b.shape[y] == b.shape[x] and b.chance(0.3):
        y = b.ew_any("Add", y, x)
        b.tag("residual")
        if b.chance(0.4):
            y = b.un("Relu", y)
    return y


def repvgg_block(b: _Builder, x: str) -> str:
    """Training-time multi-branch block (RepVGG / ACNet / DBB / MobileOne) summed, then Relu."""
    n, c, h, w = b.shape[x]
    style = b.pick(["repvgg", "acnet", "dbb", "mobileone", "scale"])
    b.tag("reparam:" + style)
    branches: List[str] = []

    group = 2 if (c % 2 == 0 and b.chance(0.2)) else 1  # RepVGG-g2 style grouped branches
    if group > 1:
        b.tag("grouped")

    def conv_bn(k, pads, bn=True, share=None):
        y = _conv(b, x, c, k, pads, group=group, bias=not bn or b.chance(0.2), share=share)
        if not bn:
            return y
        y = _bn(b, y, c)
        b.maybe_output(y, 0.08)
        return y

    if style == "repvgg":
        branches += [conv_bn((3, 3), [1, 1, 1, 1]), conv_bn((1, 1), [0, 0, 0, 0], bn=b.chance(0.8))]
        if b.chance(0.7):
            branches.append(_bn(b, x, c))
    elif style == "acnet":
        branches += [conv_bn((3, 3), [1, 1, 1, 1]), conv_bn((1, 3), [0, 1, 0, 1]),
                     conv_bn((3, 1), [1, 0, 1, 0])]
    elif style == "dbb":
        branches.append(conv_bn((3, 3), [1, 1, 1, 1]))
        y = _bn(b, _conv(b, x, c, (1, 1), [0, 0, 0, 0]), c)
        y = _bn(b, b.op("Conv", [y, b.weight((c, c, 3, 3))], (n, c, h, w), kernel_shape=[3, 3],
                        pads=[1, 1, 1, 1]), c)
        branches.append(y)
        branches.append(conv_bn((1, 1), [0, 0, 0, 0]))
        if b.chance(0.5):  # avg-pool branch
            branches.append(_bn(b, b.op("AveragePool", [x], (n, c, h, w), kernel_shape=[3, 3],
                                        pads=[1, 1, 1, 1], count_include_pad=1), c))
    elif style == "mobileone":
        for _ in range(int(b.pick([2, 3]))):
            branches.append(conv_bn((3, 3), [1, 1, 1, 1], share="m1"))
        branches.append(conv_bn((1, 1), [0, 0, 0, 0]))
    else:  # conv then a per-channel (or not) Mul + Add
        y = _conv(b, x, c, (3, 3), [1, 1, 1, 1], bias=b.chance(0.5))
        sh = b.pick([(1, c, 1, 1), (c, 1, 1), (1, 1, 1, w), (1,), (1, c, 1, 1)])
        if sh == (1, 1, 1, w):
            b.tag("not-per-channel")
        y = b.ew_any("Mul", y, b.const(b.rng.uniform(0.5, 1.5, sh).astype(_F32), "s"))
        y = b.ew_any("Add", y, b.const(b.rng.uniform(-0.5, 0.5, sh).astype(_F32), "t"))
        branches.append(y)
    y = branches[0]
    for other in branches[1:]:
        b.maybe_output(y, 0.05)
        y = b.ew_any("Add", y, other)
    b.maybe_output(y, 0.08)
    return b.un("Relu", y) if b.chance(0.8) else activation(b, y)


def image_head(b: _Builder, x: str) -> str:
    """Flatten (GlobalAveragePool or Reshape) then Gemm (+activation)."""
    n, c, h, w = b.shape[x]
    if b.chance(0.5):
        p = b.op("GlobalAveragePool", [x], (n, c, 1, 1))
        f = b.op("Flatten", [p], (n, c), axis=1)
    else:
        f = b.op("Reshape", [x, b.const(np.array([n, -1], np.int64))], (n, c * h * w))
    return linear_block(b, f, gemm=True)


# -- sequence blocks -------------------------------------------------------------------------------
def linear_block(b: _Builder, x: str, gemm: bool = False) -> str:
    """MatMul + bias (either order, [N] or rank-up bias), or Gemm on 2-D, (+activation)."""
    shape = b.shape[x]
    k = shape[-1]
    nout = int(b.pick([k, 8, 16, 4]))
    b.tag("linear")
    if (gemm or len(shape) == 2) and b.chance(0.6):
        trans_b = int(b.chance(0.4))
        wt = b.weight((nout, k) if trans_b else (k, nout))
        ins = [x, wt]
        if b.chance(0.8):
            ins.append(b.const(b.rng.uniform(-0.5, 0.5, b.pick([(nout,), (1, nout)])).astype(_F32)))
        attrs = {"transB": trans_b}
        if b.chance(0.2):
            attrs["alpha"] = 0.5
        y = b.op("Gemm", ins, (shape[0], nout), **attrs)
        b.tag("gemm")
    else:
        y = b.op("MatMul", [x, b.weight((k, nout), share="mm")], shape[:-1] + (nout,))
        if b.chance(0.8):
            bias_shape = b.pick([(nout,), (nout,), (1,) * (len(shape) - 1) + (nout,),
                                 (1,) * len(shape) + (nout,)])
            if len(bias_shape) > len(shape):
                b.tag("bcast-rank-up")
            b.maybe_output(y, 0.08)
            y = b.ew_any("Add", y, b.const(b.rng.uniform(-0.5, 0.5, bias_shape).astype(_F32), "bias"))
    if b.chance(0.6):
        b.maybe_output(y, 0.08)
        y = activation(b, y, b.pick(["gelu-erf", "gelu-tanh", "relu", "silu", "hardswish", None]))
    if len(b.shape[y]) >= 2 and b.shape[y][-2] > 1 and b.chance(0.1):  # Gather rows (a CLS pick)
        shape = b.shape[y]
        idx = b.rng.integers(-shape[-2], shape[-2], int(b.pick([1, 2]))).astype(np.int64)
        y = b.op("Gather", [y, b.const(idx, "idx")], shape[:-2] + (len(idx), shape[-1]),
                 axis=len(shape) - 2)
        b.tag("gather")
    return y


def _reduce_mean(b: _Builder, x: str, axis: int, keep_form: str) -> str:
    shape = list(b.shape[x])
    rank = len(shape)
    out = shape.copy()
    out[axis % rank] = 1
    if keep_form == "keepdims0":
        red = shape[:axis % rank] + shape[axis % rank + 1:]
        r = b.op("ReduceMean", [x], tuple(red), axes=[axis], keepdims=0)
        return b.op("Unsqueeze", [r, b.const(np.array([axis], np.int64))], tuple(out))
    attrs = {"axes": [axis]}
    if keep_form == "explicit":
        attrs["keepdims"] = 1
    return b.op("ReduceMean", [x], tuple(out), **attrs)


def norm_block(b: _Builder, x: str) -> str:
    """LayerNorm or RMSNorm in one of the exporters' spellings, (+skip Add before), (+scale, bias)."""
    shape = b.shape[x]
    rank, d = len(shape), shape[-1]
    if b.chance(0.25):  # skip / residual Add first (SkipLayerNorm, SkipRMSNorm)
        x = b.ew_any("Add", x, b.input(shape, prefix="skip"))
        b.tag("skip")
        b.maybe_output(x, 0.3)
    axis = b.pick([-1, -1, -1, rank - 1])
    if rank >= 2 and b.chance(0.08):
        axis = -2
        b.tag("wrong-axis")
    keep = b.pick(["default", "default", "explicit", "keepdims0"])
    if keep == "keepdims0":
        b.tag("keepdims0")
    eps = b.scalar(float(b.pick([1e-5, 1e-6, 1e-12])), rank, d)
    kind = b.pick(["layernorm", "rmsnorm"])
    b.tag(kind)
    if kind == "layernorm":
        mean = _reduce_mean(b, x, axis, keep)
        dev = b.ew("Sub", x, mean)
        sq = b.ew("Pow", dev, b.scalar(2.0, rank, d)) if b.chance(0.6) else b.ew("Mul", dev, dev)
        var = _reduce_mean(b, sq, axis if not b.chance(0.05) else -1, keep)
        sd = b.un("Sqrt", b.ew_any("Add", var, eps))
        y = b.ew("Div", dev, sd) if b.chance(0.7) else b.ew_any("Mul", dev, b.un("Reciprocal", sd))
    else:
        form = b.pick(["div", "reciprocal", "div1", "pow"])
        b.tag("rmsnorm:" + form)
        sq = b.ew("Pow", x, b.scalar(2.0, rank, d)) if b.chance(0.5) else b.ew("Mul", x, x)
        ms = b.ew_any("Add", _reduce_mean(b, sq, axis, keep), eps)
        if form == "div":
            y = b.ew("Div", x, b.un("Sqrt", ms))
        elif form == "reciprocal":
            y = b.ew_any("Mul", x, b.un("Reciprocal", b.un("Sqrt", ms)))
        elif form == "div1":
            y = b.ew_any("Mul", x, b.ew("Div", b.const(np.array(1.0, _F32)), b.un("Sqrt", ms)))
        else:
            y = b.ew_any("Mul", x, b.ew("Pow", ms, b.scalar(-0.5, rank, d)))
    if b.chance(0.8):
        gshape = b.pick([(d,), (d,), (1,) * (rank - 1) + (d,), (1,) * rank + (d,)])
        y = b.ew_any("Mul", y, b.const(b.rng.uniform(0.5, 1.5, gshape).astype(_F32), "gamma",
                                       share="gamma"))
    if kind == "layernorm" and b.chance(0.7):
        y = b.ew_any("Add", y, b.const(b.rng.uniform(-0.5, 0.5, (d,)).astype(_F32), "beta"))
    return y


def act_block(b: _Builder, x: str) -> str:
    b.maybe_output(x, 0.05)
    if b.chance(0.3):  # bias Add right before (BiasGelu / FastGelu bias)
        x = b.ew_any("Add", x, b.const(b.rng.uniform(-0.5, 0.5, b.shape[x][-1:]).astype(_F32), "ab"))
    return activation(b, x, b.pick(["gelu-erf", "gelu-tanh", "silu", "hardswish", None]))


# -- attention -------------------------------------------------------------------------------------
_FILLS = (-np.inf, -1e4, -1e5, -1e9, float(np.finfo(np.float32).min), -3.0e38)


def _mask_feed(b: _Builder, shape, boolean: bool, s: int, t: int) -> np.ndarray:
    """A mask input's feed: causal-ish keep pattern, sometimes with fully masked query rows."""
    keep = b.rng.random(shape) < 0.75
    if len(shape) >= 2 and shape[-2] == s and shape[-1] == t and b.chance(0.5):
        keep = np.broadcast_to(np.tril(np.ones((s, t), bool), t - s), shape).copy()
    if b.chance(0.4):  # fully masked rows (a padded query position)
        b.tag("masked-row")
        if len(shape) >= 2:
            keep[..., int(b.rng.integers(shape[-2])), :] = False
        else:
            keep[...] = False
    if boolean:
        return keep
    neg = float(b.pick([-1e4, -1e9, -np.inf, float(np.finfo(np.float32).min)]))
    return np.where(keep, 0.0, neg).astype(_F32)


def _repeat_kv(b: _Builder, kv: str, n_rep: int, how: str, head_axis: int = 1) -> str:
    """[B, Hkv, ...] -> [B, Hkv*n_rep, ...] in one of the spellings (``tile``/``concat`` repeat
    the heads in the other order, h -> h % Hkv, which is a different model)."""
    shape = list(b.shape[kv])
    out = shape.copy()
    out[head_axis] *= n_rep
    if how == "expand":  # transformers' repeat_kv: Unsqueeze(2) -> Expand -> Reshape
        un = shape[:head_axis + 1] + [1] + shape[head_axis + 1:]
        u = b.op("Unsqueeze", [kv, b.const(np.array([head_axis + 1], np.int64))], tuple(un))
        ex = un.copy()
        ex[head_axis + 1] = n_rep
        e = b.op("Expand", [u, b.const(np.array(ex, np.int64))], tuple(ex))
        return b.op("Reshape", [e, b.const(np.array(out, np.int64))], tuple(out))
    if how == "expand0":  # Reshape with 0 and -1 (copied dims)
        un = shape[:head_axis + 1] + [1] + shape[head_axis + 1:]
        u = b.op("Unsqueeze", [kv, b.const(np.array([head_axis + 1], np.int64))], tuple(un))
        ex = un.copy()
        ex[head_axis + 1] = n_rep
        e = b.op("Expand", [u, b.const(np.array(ex, np.int64))], tuple(ex))
        spec = [0, out[1], -1, out[3]]  # batch copied (0), key length inferred (-1)
        return b.op("Reshape", [e, b.const(np.array(spec, np.int64))], tuple(out))
    if how == "tile":
        reps = [1] * len(shape)
        reps[head_axis] = n_rep
        return b.op("Tile", [kv, b.const(np.array(reps, np.int64))], tuple(out))
    if how == "concat":
        return b.op("Concat", [kv] * n_rep, tuple(out), axis=head_axis)
    raise ValueError(how)


def attention_block(b: _Builder, x: Optional[str]) -> str:
    """Scaled dot-product attention as exporters write it, from a [B, S, E] ``x`` (projections,
    head split) or from Q/K/V graph inputs ([B, H, S, D]); returns the [B, S, H*Dv] (projected) or
    [B, H, S, Dv] output."""
    rng = b.rng
    b.attention += 1
    b.tag("attention")
    if x is not None:
        bsz, s, e = b.shape[x]
        d = e // int(b.pick([h for h in (1, 2, 4) if e % h == 0 and e // h >= 2]))
        h = e // d
    else:
        bsz, s = int(b.pick([1, 2])), int(b.pick([1, 3, 4, 5]))
        h, d = int(b.pick([1, 2, 4])), int(b.pick([4, 8, 8, 16]))
    hkv = int(b.pick([v for v in (h, h, 1, h // 2) if v >= 1 and h % v == 0]))
    n_rep = h // hkv
    t = s if (x is not None or b.chance(0.7)) else int(b.pick([2, 4, 6]))
    dv = d if (x is not None or b.chance(0.85)) else int(b.pick([4, 8]))
    if hkv < h:
        b.tag("gqa" if hkv > 1 else "mqa")
    kt_form = "transpose"
    if x is not None:
        def proj(heads, size, name):
            y = b.op("MatMul", [x, b.weight((e, heads * size))], (bsz, s, heads * size))
            if b.chance(0.5):
                y = b.ew("Add", y, b.const(rng.uniform(-0.3, 0.3, heads * size).astype(_F32), "pb"))
            return b.op("Reshape", [y, b.const(np.array(b.pick([[bsz, s, heads, size],
                                                                 [0, 0, heads, size],
                                                                 [bsz, -1, heads, size]]),
                                                        np.int64))], (bsz, s, heads, size))
        q4 = proj(h, d, "q")
        q = b.op("Transpose", [q4], (bsz, h, s, d), perm=[0, 2, 1, 3])
        k4 = proj(hkv, d, "k")
        if b.chance(0.4):  # K^T straight from [B, T, Hkv, D]
            kt_form = "perm0231"
            k = None
            kt0 = b.op("Transpose", [k4], (bsz, hkv, d, t), perm=[0, 2, 3, 1])
        else:
            k = b.op("Transpose", [k4], (bsz, hkv, t, d), perm=[0, 2, 1, 3])
        v = b.op("Transpose", [proj(hkv, dv, "v")], (bsz, hkv, t, dv), perm=[0, 2, 1, 3])
    else:
        q = b.input((bsz, h, s, d), prefix="q")
        k = b.input((bsz, hkv, t, d), prefix="k")
        v = b.input((bsz, hkv, t, dv), prefix="v")
    # repeat_kv, K and V possibly written differently
    if n_rep > 1:
        k_how = b.pick(["expand", "expand", "expand0", "tile", "concat"])
        v_how = k_how if b.chance(0.75) else b.pick(["expand", "tile", "concat"])
        b.tag(f"repeat:{k_how}/{v_how}")
        if k is not None and b.chance(0.2):  # transpose first, then repeat (12a)
            kt_form = "transpose-then-repeat"
            k = b.op("Transpose", [k], (bsz, hkv, d, t), perm=[0, 1, 3, 2])
        if k is None:
            kt_form = "perm0231-then-repeat"
            k = kt0
        k = _repeat_kv(b, k, n_rep, k_how)
        v = _repeat_kv(b, v, n_rep, v_how)
    elif k is None:
        k = kt0
    if kt_form in ("transpose",):
        kt = b.op("Transpose", [k], (bsz, h, d, t), perm=[0, 1, 3, 2])
    else:
        kt = k
    b.tag("kt:" + kt_form)
    # scale
    scale_form = b.pick(["mul-after", "div-after", "mul-q", "split", "mul-after", "div-after"]
                       + ["none"] * int(b.chance(0.3)))
    scale = 1 / np.sqrt(d)
    if b.chance(0.06):
        scale *= 0.5
        b.tag("wrong-scale")
    b.tag("scale:" + scale_form)
    sk = lambda v: b.scalar(float(v), 3, 1)  # noqa: E731  (a [1,1,1,1]-style constant at most)
    if scale_form == "mul-q":
        q = b.ew_any("Mul", q, sk(scale))
    elif scale_form == "split":
        q = b.ew_any("Mul", q, sk(np.sqrt(scale)))
        kt = b.ew_any("Mul", kt, sk(np.sqrt(scale)))
    scores = b.op("MatMul", [q, kt], (bsz, h, s, t))
    if scale_form == "mul-after":
        scores = b.ew_any("Mul", scores, sk(scale))
    elif scale_form == "div-after":
        scores = b.ew("Div", scores, sk(1 / scale))
    # mask
    mask_form = b.pick(["none", "add", "where", "where", "causal"])
    b.tag("mask:" + mask_form)
    mask_shapes = [(1, 1, 1, t), (1, 1, s, t), (bsz, h, s, t), (bsz, 1, s, t), (s, t), (t,),
                   (s, 1), (1, h, 1, 1), (1,), (bsz, 1, 1, t)]
    if mask_form == "add":
        mshape = b.pick(mask_shapes)
        b.tag(f"mask-shape:{list(mshape)}")
        if b.chance(0.3):
            m = b.const(_mask_feed(b, mshape, False, s, t), "mask")
        else:
            m = b.input(mshape, value=_mask_feed(b, mshape, False, s, t), prefix="mask")
        scores = b.ew_any("Add", scores, m)
    elif mask_form in ("where", "causal"):
        fill = float(b.pick(_FILLS))
        b.tag(f"fill:{fill:g}")
        if mask_form == "causal":
            off = t - s if not b.chance(0.15) else t - s - 1  # -1: first query row fully masked
            keep_arr = np.tril(np.ones((s, t), bool), off)
            if off < t - s:
                b.tag("masked-row")
            if b.chance(0.5):
                keep_arr = keep_arr[None, None]
            keep = b.const(keep_arr, "causal")
        else:
            mshape = b.pick(mask_shapes)
            b.tag(f"mask-shape:{list(mshape)}")
            keep = b.input(mshape, TensorProto.BOOL, value=_mask_feed(b, mshape, True, s, t),
                           prefix="keep")
        fill_c = b.const(np.full(b.pick([(), (1,), (1, 1, 1, 1)]), fill, _F32), "fill")
        if b.chance(0.1):  # Where(masked, fill, s)
            masked = b.un("Not", keep)
            scores = b.op("Where", [masked, fill_c, scores],
                          np.broadcast_shapes(b.shape[keep], b.shape[scores], b.shape[fill_c]))
        else:
            scores = b.op("Where", [keep, scores, fill_c],
                          np.broadcast_shapes(b.shape[keep], b.shape[scores], b.shape[fill_c]))
    # softmax
    axis = -1 if not b.chance(0.05) else 2
    if axis != -1:
        b.tag("wrong-axis")
    soft_form = b.pick(["plain", "plain", "nan-guard", "cast", "cast-after"])
    b.tag("softmax:" + soft_form)
    if soft_form == "cast":
        scores = b.un("Cast", scores, to=TensorProto.FLOAT)
    p = b.op("Softmax", [scores], b.shape[scores], axis=axis)
    if soft_form == "nan-guard":
        p = b.op("Where", [b.un("IsNaN", p), b.const(np.array(0.0, _F32)), p], b.shape[p])
    elif soft_form in ("cast", "cast-after"):
        p = b.un("Cast", p, to=TensorProto.FLOAT)
    b.maybe_output(p, 0.05)
    o = b.op("MatMul", [p, v], b.shape[p][:-1] + (dv,))
    if x is None and b.chance(0.5):
        return o
    ot = b.op("Transpose", [o], (b.shape[o][0], s, h, dv), perm=[0, 2, 1, 3])
    y = b.op("Reshape", [ot, b.const(np.array([b.shape[o][0], s, h * dv], np.int64))],
             (b.shape[o][0], s, h * dv))
    if b.chance(0.5):
        y = b.op("MatMul", [y, b.weight((h * dv, h * dv))], b.shape[y])
    return y


# -- constant subgraphs (cleanup) -----------------------------------------------------------------
def const_block(b: _Builder, x: str) -> str:
    """``x`` times / plus a weight computed from initializers (what fold-constants evaluates)."""
    shape = b.shape[x]
    k = shape[-1]
    form = b.pick(["transpose", "lpnorm", "castmul", "arith", "reshape", "shape", "identity",
                   "reduce", "cse"])
    b.tag("const:" + form)
    rng = b.rng
    if form == "transpose":
        w = b.op("Transpose", [b.weight((k, k))], (k, k), perm=[1, 0])
        return b.op("MatMul", [x, w], shape)
    if form == "lpnorm":
        w = b.op("LpNormalization", [b.weight((k, k))], (k, k), axis=int(b.pick([-1, 0])),
                 p=int(b.pick([1, 2])))
        return b.op("MatMul", [x, w], shape)
    if form == "castmul":
        q = b.const(rng.integers(-127, 128, (k, k)).astype(np.int8), "q8")
        w = b.ew("Mul", b.op("Cast", [q], (k, k), to=TensorProto.FLOAT),
                 b.const(rng.uniform(0.001, 0.02, (1, k)).astype(_F32), "qs"))
        return b.op("MatMul", [x, w], shape)
    if form == "arith":
        a = b.weight((k,))
        c = b.un(b.pick(["Sqrt", "Exp", "Abs", "Neg", "Reciprocal", "Softplus"]),
                 b.ew("Add", b.un("Abs", a), b.const(np.array(0.5, _F32))))
        return b.ew_any(b.pick(["Mul", "Add", "Sub", "Div"]), x, c)
    if form == "reshape":
        w = b.op("Reshape", [b.weight((k * k,)), b.const(np.array([k, k], np.int64))], (k, k))
        return b.op("MatMul", [x, w], shape)
    if form == "shape":  # Reshape of x to its own shape through Shape (a no-op Reshape)
        s = b.op("Shape", [x], (len(shape),))
        return b.op("Reshape", [x, s], shape)
    if form == "identity":
        i = b.un("Identity", x)
        b.maybe_output(i, 0.2)
        return b.un("Relu", i)
    if form == "reduce":
        w = b.op("ReduceSum", [b.weight((k, 3, k)), b.const(np.array([1], np.int64))], (k, k),
                 keepdims=0)
        return b.op("MatMul", [x, w], shape)
    # cse: the same expression twice
    c1 = b.un("Sigmoid", x)
    c2 = b.un("Sigmoid", x)
    return b.ew("Add", c1, b.ew("Mul", c2, b.const(np.array(0.5, _F32))))


# -- the graph -----------------------------------------------------------------------------------
_SEQ_BLOCKS = {"linear": linear_block, "norm": norm_block, "act": act_block,
               "attention": attention_block, "const": const_block}
_IMG_BLOCKS = {"conv": conv_block, "repvgg": repvgg_block, "const-img": None}

_WEIGHTS = {  # focus -> block kind -> weight
    "mix": {"conv": 2, "repvgg": 1, "linear": 2, "norm": 2, "act": 2, "attention": 2, "const": 1},
    "conv": {"conv": 6, "repvgg": 1, "linear": 1, "norm": 0, "act": 0, "attention": 0, "const": 0},
    "repvgg": {"conv": 1, "repvgg": 6},
    "linear": {"linear": 5, "act": 2, "norm": 1},
    "norm": {"norm": 5, "linear": 1, "act": 1},
    "act": {"act": 5, "linear": 2, "conv": 1},
    "attention": {"attention": 6, "linear": 1, "norm": 1},
    "const": {"const": 4, "linear": 1, "conv": 1},
}


def _first_kind(b: _Builder, focus: str) -> str:
    weights = _WEIGHTS[focus]
    kinds = [k for k, w in weights.items() if w > 0]
    p = np.array([weights[k] for k in kinds], float)
    return kinds[int(b.rng.choice(len(kinds), p=p / p.sum()))]


def _build(b: _Builder, focus: str) -> List[str]:
    kind = _first_kind(b, focus)
    image = kind in ("conv", "repvgg")
    n_blocks = int(b.pick([1, 1, 2, 2, 3]))
    if image:
        x = b.input((1, int(b.pick([2, 4, 8])), int(b.pick([3, 4, 5, 6])), int(b.pick([3, 4, 5]))))
        for i in range(n_blocks):
            k = kind if i == 0 else b.pick(["conv", "repvgg", kind])
            if len(b.shape[x]) != 4:  # a rank-up "scalar" constant broadcast it to rank 5
                x = b.op("Reshape", [x, b.const(np.array(b.shape[x][-4:], np.int64))],
                         b.shape[x][-4:])
            x = (repvgg_block if k == "repvgg" else conv_block)(b, x)
            b.maybe_output(x, 0.1)
        if b.chance(0.3) and len(b.shape[x]) == 4:
            x = image_head(b, x)
        return [x]
    if kind == "attention" and b.chance(0.4):
        x = attention_block(b, None)
        n_blocks = 1
    else:
        bsz, s = int(b.pick([1, 2])), int(b.pick([1, 3, 4, 5]))
        e = int(b.pick([8, 8, 16, 12, 32 if kind == "attention" else 16]))
        x = b.input((bsz, s, e) if b.chance(0.85) else (s, e))
        if kind == "attention" and len(b.shape[x]) != 3:
            kind = "linear"
    for i in range(n_blocks):
        k = kind if i == 0 else _first_kind(b, focus)
        if k in ("conv", "repvgg") or (k == "attention" and len(b.shape[x]) != 3):
            k = "linear"
        if i > 0:
            b.maybe_output(x, 0.1)
        x = _SEQ_BLOCKS[k](b, x)
    return [x]


def generate(seed: int, focus: str = "mix") -> FuzzGraph:
    """The graph of ``seed`` under ``focus`` (one of :data:`FOCI`); the same arguments give the
    same graph and feeds.

    Raises:
        GeneratorError: the graph fails ``onnx.checker`` (full check) or ONNX Runtime at
            ``ORT_DISABLE_ALL`` (a generator bug).
    """
    if focus not in _WEIGHTS:
        raise ValueError(f"focus '{focus}' is not one of {', '.join(FOCI)}")
    rng = np.random.default_rng([seed, FOCI.index(focus)])
    b = _Builder(rng)
    outs = _build(b, focus)
    if rng.random() < 0.1:  # NaN in an input
        name = b.pick([n for n, a in b.feeds.items() if a.dtype == _F32])
        flat = b.feeds[name].reshape(-1)
        flat[rng.integers(flat.size, size=int(rng.integers(1, 3)))] = np.nan
        b.tag("nan")
    outputs = list(dict.fromkeys(outs + b.extra_outputs))
    graph = helper.make_graph(b.nodes, f"fuzz{seed}", b.inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in outputs], list(b.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    try:
        values = _ort_run(model, b.feeds)
    except Exception as e:  # noqa: BLE001  (any ONNX Runtime failure is the generator's)
        raise GeneratorError(f"seed {seed} focus {focus}: ONNX Runtime refuses the graph: "
                             f"{str(e).splitlines()[0][:300]}") from e
    del model.graph.output[:]
    for name, value in zip(outputs, values):
        model.graph.output.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    if rng.random() < 0.3:  # declared (correct) shapes for the intermediate values, as exports have
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        b.tag("value-info")
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001
        raise GeneratorError(f"seed {seed} focus {focus}: onnx.checker: "
                             f"{str(e).splitlines()[0][:300]}") from e
    return FuzzGraph(seed, focus, model, b.feeds, b.tags, b.attention)


def _ort_run(model: onnx.ModelProto, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


__all__ = ["FOCI", "FuzzGraph", "GeneratorError", "generate"]
