"""AWQ: activation-aware per-input-channel scales for weight-only quantization, folded exactly.

Source: Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration" (MLSys 2024, arXiv 2306.00978), section 3.2: for ``Y = X W`` (``X`` ``[T, K]``,
``W`` ``[K, N]``) scale input channel ``j`` by ``s_j = mean_t |X_tj|^alpha``::

    Y = (X diag(s)^-1) Q(diag(s) W)

with ``alpha`` searched on a grid per group of layers that read one ``X``, minimizing that
group's calibration output error ``sum ||X W - (X / s) Q(diag(s) W)||^2`` (the authors' code,
``llm-awq/awq/quantize/auto_scale.py``: 20 points in [0, 1), ``s / sqrt(max(s) min(s))``; here
:data:`ALPHAS`, with alpha 0 = no scaling, so the chosen scales never raise that error over
plain round-to-nearest). ``diag(s)^-1`` is folded into what produces ``X``, exactly in real
arithmetic:

* **norm**: ``X`` is output 0 of a ``SimplifiedLayerNormalization`` /
  ``SkipSimplifiedLayerNormalization`` (ONNX Runtime's RMSNorm, the decoder's) or
  ``LayerNormalization`` with a constant ``gamma`` (and ``beta``), read only by the group
  (Q/K/V fused or not, gate/up), possibly through ``Slice`` / ``Reshape`` nodes that keep the
  last axis (the decoder's last-token LM head): ``gamma / s`` (``beta / s``). The skip-norm's
  residual output (input + skip) does not depend on ``gamma``.
* **linear**: ``X = Mul(a, b)`` with ``b`` a column range of a MatMul with a constant weight
  (directly, or one output of a ``Split`` on the last axis), read only by the Mul: those columns
  divided by ``s`` (SwiGLU's ``up_proj`` for ``down_proj``; AWQ's ``scale_fc_fc``).

Not folded (left at round-to-nearest): inputs that come through attention (``o_proj``: AWQ folds
it into ``v_proj`` only when v and o have one shape, i.e. without grouped-query attention, and
the decoder's GroupQueryAttention takes fused Q/K/V where a scale of v would also have to be
shared by the query heads of a group), and anything else.

A Gemm's weight, or a MatMul's weight read by other nodes (a tied embedding's Gather), is given
its own scaled copy; the original stays for the other readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from passctl.ir import DataType, Model, Node, TensorType, Value
from passctl.passes._snapshot import clone_model
from passctl.passes.precision.sensitivity import Feeds, run_model
from passctl.passes.quantize.layers import constant_array

ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
"""The alpha grid (0, 0.1, ... 1.0; the authors' code: 20 points in [0, 1))."""
NORMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization")
MAX_ROWS = 512
"""Calibration rows (tokens) per group used in the alpha search (a seeded sample of all of them;
the mean |x| uses all)."""


@dataclass
class AwqGroup:
    """Layers reading one activation ``X`` and where ``diag(s)^-1`` is folded.

    Attributes:
        members: positions (in ``list(graph)``) of the MatMul / Gemm layers.
        value: name of the value whose rows are ``X`` (the norm's or the Mul's output).
        k: channels ``K``.
        fold: ``norm``, ``linear`` or ``none`` (a layer measured at alpha 0 only, for its error).
        axes: axes that must not be ``X``'s last one (Slices passed on the way to a member);
            ``last_axes``: axes that must be (the Split's); checked against ``X``'s rank in
            :func:`collect` (groups failing it are dropped).
        source: position of the norm node, or of the MatMul whose columns are divided.
        columns: ``(start, stop)`` of those columns (``linear``).
        xmean: float64 ``[K]``: mean |x| over calibration rows; ``x``: float32 ``[rows, K]``
            sample (set by :func:`collect`).
        alpha, scales, errors: the search's choice, ``s``, and ``{alpha: relative error}``.
    """

    members: List[int]
    value: str
    k: int
    fold: str
    source: int
    columns: Tuple[int, int] = (0, 0)
    axes: List[int] = field(default_factory=list)
    last_axes: List[int] = field(default_factory=list)
    xmean: Optional[np.ndarray] = None
    x: Optional[np.ndarray] = None
    alpha: float = 0.0
    scales: Optional[np.ndarray] = None
    errors: Dict[float, float] = field(default_factory=dict)


def layer_weight(node: Node) -> Optional[np.ndarray]:
    """``[K, N]`` float32 view of a MatMul's B or a Gemm's B (transposed when transB=1, times
    alpha), or None."""
    w = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    if node.op_type == "Gemm":
        w = (w.T if node.attr("transB", 0) else w) * np.float32(node.attr("alpha", 1.0))
    return w


def _through(value: Value, k: int) -> Tuple[Value, List[int]]:
    """Walk up from ``value`` (last dimension ``k``) through single-reader Slice (constant axes,
    not the last one) / Reshape (to a constant shape ending in ``k``) nodes; returns the value
    reached and the Slice axes passed (non-negative axes are checked against the rank seen in
    the calibration run, :func:`collect`, the IR holding no shapes there)."""
    axes_seen: List[int] = []
    while True:
        p = value.producer
        if p is None or len(value.uses()) != 1 or value.is_graph_output():
            return value, axes_seen
        if p.op_type == "Reshape":
            shape = constant_array(p.inputs[1])
            if shape is None or shape.ndim != 1 or not len(shape) or int(shape[-1]) != k:
                return value, axes_seen
        elif p.op_type == "Slice":
            axes = constant_array(p.inputs[3]) if len(p.inputs) > 3 and p.inputs[3] is not None \
                else None
            if axes is None or any(int(a) == -1 for a in axes):
                return value, axes_seen
            axes_seen.extend(int(a) for a in axes)
        else:
            return value, axes_seen
        value = p.inputs[0]


def find_groups(model: Model, positions: Sequence[int]) -> List[AwqGroup]:
    """The groups of the layers at ``positions`` (MatMul / Gemm with a constant float32 weight)
    whose input can take AWQ scales (module docstring); layers not in a group are left alone."""
    nodes = list(model.graph)
    index = {id(n): i for i, n in enumerate(nodes)}
    wanted = set(positions)
    by_value: Dict[str, List[int]] = {}
    axes_of: Dict[str, List[int]] = {}
    for p in sorted(wanted):
        node = nodes[p]
        if node.op_type not in ("MatMul", "Gemm") or layer_weight(node) is None:
            continue
        if node.op_type == "Gemm" and (node.attr("transA", 0) or float(node.attr("beta", 1.0))
                                       != 1.0):
            continue
        x, axes = _through(node.inputs[0], layer_weight(node).shape[0])
        by_value.setdefault(x.name, []).append(p)
        axes_of.setdefault(x.name, []).extend(axes)
    values = {v.name: v for n in nodes for v in n.outputs if v is not None}
    groups: List[AwqGroup] = []
    for name, members in by_value.items():
        x = values.get(name)
        if x is None or x.is_graph_output():
            continue
        readers = set()
        for n, _ in x.uses():
            end = n
            while end.op_type in ("Slice", "Reshape") and index[id(end)] not in members:
                nxt = end.outputs[0].uses()
                if len(nxt) != 1:
                    break
                end = nxt[0][0]
            readers.add(index[id(end)])
        if readers != set(members):
            continue
        k = layer_weight(nodes[members[0]]).shape[0]
        if any(layer_weight(nodes[m]).shape[0] != k for m in members):
            continue
        g = _norm_group(x, members, k, index) or _linear_group(x, members, k, index)
        if g is not None:
            g.axes += axes_of[name]
            groups.append(g)
    grouped = {m for g in groups for m in g.members}
    for p in sorted(wanted - grouped):  # measured (alpha 0 only), not scaled
        node = nodes[p]
        w = layer_weight(node) if node.op_type in ("MatMul", "Gemm") else None
        if w is not None and node.inputs[0] is not None:
            groups.append(AwqGroup([p], node.inputs[0].name, w.shape[0], "none", p))
    return groups


def _norm_group(x: Value, members: List[int], k: int, index) -> Optional[AwqGroup]:
    p = x.producer
    if p is None or p.op_type not in NORMS or x is not p.outputs[0]:
        return None
    gamma = constant_array(p.inputs[2 if p.op_type == "SkipSimplifiedLayerNormalization" else 1])
    if gamma is None or gamma.dtype != np.float32 or gamma.shape != (k,):
        return None
    if p.op_type == "LayerNormalization" and len(p.inputs) > 2 and p.inputs[2] is not None:
        beta = constant_array(p.inputs[2])
        if beta is None or beta.shape != (k,):
            return None
    if p.op_type == "SkipSimplifiedLayerNormalization" and len(p.inputs) > 3 and p.inputs[3]:
        return None  # a bias is added before normalizing; gamma alone still scales the output
    g = AwqGroup(list(members), x.name, k, "norm", index[id(p)])
    axis = int(p.attr("axis", -1))
    if axis != -1:  # gamma scales the normalized axis, which must be X's channels
        g.last_axes = [axis]
    return g


def _linear_group(x: Value, members: List[int], k: int, index) -> Optional[AwqGroup]:
    mul = x.producer
    if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2:
        return None
    for b in mul.inputs:
        if b is None or len(b.uses()) != 1:
            continue
        p, start = b.producer, 0
        if p is not None and p.op_type == "Split":
            sizes = constant_array(p.inputs[1]) if len(p.inputs) > 1 else None
            if sizes is None:
                continue
            axis = int(p.attr("axis", 0))
            slot = list(p.outputs).index(b)
            if sizes.ndim != 1 or slot >= len(sizes) or int(sizes[slot]) != k:
                continue
            start = int(np.sum(sizes[:slot]))
            src = p.inputs[0]
            if len(src.uses()) != 1:
                continue
            p = src.producer
        if p is None or p.op_type != "MatMul" or layer_weight(p) is None \
                or layer_weight(p).shape[1] < start + k:
            continue
        if b.producer.op_type == "MatMul" and layer_weight(p).shape[1] != k:
            continue
        g = AwqGroup(list(members), x.name, k, "linear", index[id(p)], (start, start + k))
        if b.producer.op_type == "Split":
            g.last_axes = [axis]
        return g
    return None


def collect(model: Model, groups: List[AwqGroup], feeds: Feeds, seed: int = 0) -> List[AwqGroup]:
    """Set each group's ``xmean`` (mean |x| per channel over every calibration row) and ``x``
    (up to :data:`MAX_ROWS` rows, a seeded sample) from one ONNX Runtime run per feed of a copy
    of ``model`` returning the groups' inputs. Returns the groups whose axes checks pass
    (:class:`AwqGroup`)."""
    work = clone_model(model)
    values = {v.name: v for n in work.graph for v in n.outputs if v is not None}
    originals = [v.name for v in work.graph.outputs]
    exposed = []
    for name in dict.fromkeys(g.value for g in groups):
        v = values.get(name)  # None: a graph input, read from the feeds
        if v is None or name in originals:
            continue
        if v.type is None:
            v.type = TensorType(DataType.FLOAT, None)
        exposed.append(v)
    work.graph.outputs = list(work.graph.outputs) + exposed
    rows: Dict[str, List[np.ndarray]] = {g.value: [] for g in groups}
    rank: Dict[str, int] = {}
    results = run_model(work, feeds, outputs=originals + [v.name for v in exposed], optimize=True)
    for feed, r in zip(feeds, results):
        for g in groups:
            a = np.asarray(r[g.value] if g.value in r else feed[g.value], np.float32)
            rank[g.value] = a.ndim
            rows[g.value].append(a.reshape(-1, g.k))
    rng = np.random.default_rng(seed)
    kept = []
    for g in groups:
        n = rank.get(g.value, 0)
        if not n or any(a % n == n - 1 for a in g.axes) or any(a % n != n - 1
                                                                 for a in g.last_axes):
            continue
        kept.append(g)
        x = np.concatenate(rows[g.value])
        g.xmean = np.abs(x).astype(np.float64).mean(0)
        g.x = x[np.sort(rng.choice(len(x), MAX_ROWS, replace=False))] if len(x) > MAX_ROWS else x
    return kept


def scales_of(xmean: np.ndarray, alpha: float) -> np.ndarray:
    """``s = mean|x|^alpha`` normalized by ``sqrt(max(s) min(s))`` (AWQ's code), float32 ``[K]``;
    channels never active get scale 1."""
    a = np.where(xmean > 0, xmean, np.max(xmean) if np.any(xmean > 0) else 1.0)
    s = np.power(a, alpha)
    return (s / np.sqrt(s.max() * s.min())).astype(np.float32)


def search(groups: List[AwqGroup], weights: Dict[int, np.ndarray],
           quantize: Callable[[np.ndarray], np.ndarray]) -> Dict[int, float]:
    """Choose each group's alpha on :data:`ALPHAS` by the group's relative calibration output
    error ``||X W - (X / s) Q(diag(s) W)|| / ||X W||`` (``quantize``: ``W -> dequant(codes)``;
    ``weights``: ``[K, N]`` by member position). Returns ``{member position: its own relative
    error at the chosen alpha}``."""
    layer_err: Dict[int, float] = {}
    for g in groups:
        x = g.x.astype(np.float32)
        refs = {m: x @ weights[m] for m in g.members}
        best = None
        for alpha in (ALPHAS if g.fold != "none" else (0.0,)):
            s = scales_of(g.xmean, alpha)
            xs = x / s
            num = den = 0.0
            per = {}
            for m in g.members:
                y = xs @ quantize(weights[m] * s[:, None])
                e = float(np.sum((y - refs[m]).astype(np.float64) ** 2))
                d = float(np.sum(refs[m].astype(np.float64) ** 2))
                per[m] = np.sqrt(e / d) if d > 0 else 0.0
                num += e
                den += d
            g.errors[alpha] = float(np.sqrt(num / den)) if den > 0 else 0.0
            if best is None or g.errors[alpha] < best[0]:
                best = (g.errors[alpha], alpha, s, per)
        _, g.alpha, g.scales, per = best
        layer_err.update(per)
    return layer_err


def fold(model: Model, groups: List[AwqGroup]) -> int:
    """Rewrite ``model`` in place with each group's ``scales`` (module docstring): member weights
    ``diag(s) W`` (a new constant each), ``1 / s`` into the norm's gamma (and beta) or the
    preceding MatMul's columns. Groups with alpha 0 are skipped. Returns the groups folded."""
    graph = model.graph
    nodes = list(graph)
    replaced: List[Value] = []
    done = 0
    for g in groups:
        if g.scales is None or g.alpha == 0 or g.fold == "none":
            continue
        s = g.scales
        inv = (np.float32(1) / s).astype(np.float32)
        for m in g.members:
            node = nodes[m]
            w = constant_array(node.inputs[1])
            if node.op_type == "Gemm" and node.attr("transB", 0):
                new = w * s[None, :]
            else:
                new = w * s[:, None]
            replaced.append(node.inputs[1])
            node.set_input(1, graph.add_constant(new.astype(np.float32),
                                                 f"{node.inputs[1].name}_awq"))
        src = nodes[g.source]
        if g.fold == "norm":
            slots = [2] if src.op_type == "SkipSimplifiedLayerNormalization" else [1]
            if src.op_type == "LayerNormalization" and len(src.inputs) > 2 and src.inputs[2]:
                slots.append(2)
            for i in slots:
                replaced.append(src.inputs[i])
                src.set_input(i, graph.add_constant(
                    (constant_array(src.inputs[i]) * inv).astype(np.float32),
                    f"{src.inputs[i].name}_awq"))
        else:
            w = constant_array(src.inputs[1]).copy()
            a, b = g.columns
            w[:, a:b] = w[:, a:b] * inv[None, :]
            replaced.append(src.inputs[1])
            src.set_input(1, graph.add_constant(w.astype(np.float32), f"{src.inputs[1].name}_awq"))
        done += 1
    for v in dict.fromkeys(replaced):
        if not v.uses() and not v.is_graph_output() and not v.is_graph_input() \
                and v.is_initializer():
            graph.remove_initializer(v.name)
    return done


__all__ = ["ALPHAS", "AwqGroup", "collect", "find_groups", "fold", "scales_of",
           "search"]
