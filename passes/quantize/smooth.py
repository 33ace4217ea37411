"""SmoothQuant smoothing of the MatMuls that read a LayerNormalization: activation outliers
migrated into the weights, a rewrite that is exact in real arithmetic.

Source: Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models" (ICML 2023), section 4: for ``Y = X W`` with ``X`` ``[T, K]``, per input
channel ``j``::

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha),    Y = (X diag(s)^-1) (diag(s) W)

``max|X_j|`` over calibration activations, ``max|W_j|`` over row ``j`` of every weight that reads
``X`` (the paper's Q/K/V share one ``s``), both clamped below at 1e-5 as in the authors' code
(``smoothquant/smooth.py``, ``smooth_ln_fcs``). Like the paper, only the inputs of the
attention projections and the first FFN layer are smoothed, the MatMuls whose input is a
LayerNormalization's output, and ``diag(s)^-1`` is folded into the LayerNorm's ``gamma`` and
``beta`` (``LN(x) / s = (x - mu) / sigma * (gamma / s) + beta / s``). In a post-LN encoder (BERT,
MiniLM) the LayerNorm's output also feeds the residual Add, which must keep the unsmoothed value;
there a ``Mul(LN(x), 1/s)`` in front of the smoothed MatMuls does the division instead.

Measured on all-MiniLM-L6-v2, every MatMul dynamic int8, mean-pooled embedding cosine against
fp32 on the 200 sentences of tests/data/sentences.txt (benchmarks/results/
quantize_dynamic-2026-12-02b.md): no smoothing 0.9935; LayerNorm-fed MatMuls smoothed (alpha 0.7)
0.9967; the inputs of the attention output and FFN output MatMuls (after GELU) smoothed as well,
through Muls, 0.9950; so the placement here is the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from passctl.ir import Builder, DataType, Model, Node, TensorType, Value
from passctl.passes._snapshot import clone_model
from passctl.passes.precision.sensitivity import Feeds, run_model
from passctl.passes.quantize.layers import constant_array

CLAMP = 1e-5
"""Lower clamp of ``max|X_j|`` and ``max|W_j|`` (SmoothQuant's code, ``clamp(min=1e-5)``)."""
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
"""Migration strengths tried by ``smooth=search`` (the paper uses 0.5 for most models, up to 0.75
and more for GLM-130B; Figure 10 shows the sweet spot between 0.4 and 0.8 on OPT-175B)."""


@dataclass
class SmoothGroup:
    """MatMuls reading one LayerNormalization output.

    Attributes:
        ln: position of the LayerNormalization node in ``list(graph)`` (stable across
            ``clone_model``).
        members: positions of the MatMuls (constant float32 ``B [K, N]``, input 0 the LN output).
        k: the channel count ``K`` (``gamma``'s length).
        wmax: float32 ``[K]``: ``max_j |W_j|`` over every member's row ``j``.
        amax: float32 ``[K]``: ``max |X_j|`` over the calibration feeds (set by
            :func:`activation_absmax`).
    """

    ln: int
    members: List[int]
    k: int
    wmax: np.ndarray
    amax: Optional[np.ndarray] = None


def layernorm_groups(model: Model, positions: Sequence[int]) -> List[SmoothGroup]:
    """Groups of the MatMuls at ``positions`` (candidate layers) whose input 0 is output 0 of a
    ``LayerNormalization`` (default domain, normalizing the last axis, constant float32 ``Scale``
    ``[K]`` and ``B`` ``[K]`` or none) and whose weight is a constant float32 ``[K, N]``."""
    nodes = list(model.graph)
    index = {id(n): i for i, n in enumerate(nodes)}
    wanted = set(positions)
    groups: Dict[int, SmoothGroup] = {}
    for p in sorted(wanted):
        node = nodes[p]
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        x = node.inputs[0]
        ln = x.producer
        if ln is None or ln.op_type != "LayerNormalization" or ln.domain not in ("", "ai.onnx") \
                or x is not ln.outputs[0]:
            continue
        w = constant_array(node.inputs[1])
        gamma = constant_array(ln.inputs[1]) if len(ln.inputs) > 1 else None
        beta = constant_array(ln.inputs[2]) if len(ln.inputs) > 2 and ln.inputs[2] is not None \
            else None
        if w is None or w.dtype != np.float32 or w.ndim != 2 or gamma is None \
                or gamma.dtype != np.float32 or gamma.shape != (w.shape[0],):
            continue
        if len(ln.inputs) > 2 and ln.inputs[2] is not None and (
                beta is None or beta.shape != gamma.shape or beta.dtype != np.float32):
            continue
        axis = int(ln.attr("axis", -1))
        rank = None if ln.inputs[0].shape is None else ln.inputs[0].shape.rank
        if axis != -1 and (rank is None or axis != rank - 1):
            continue
        wmax = np.abs(w).max(axis=1).astype(np.float32)
        g = groups.get(index[id(ln)])
        if g is None:
            groups[index[id(ln)]] = SmoothGroup(index[id(ln)], [p], w.shape[0], wmax)
        else:
            g.members.append(p)
            g.wmax = np.maximum(g.wmax, wmax)
    return list(groups.values())


def activation_absmax(model: Model, groups: List[SmoothGroup], feeds: Feeds) -> None:
    """Set each group's ``amax``: per-channel ``max |x|`` of its LayerNorm output over ``feeds``
    (one ONNX Runtime run of a copy of ``model`` with those values made graph outputs,
    optimizations off)."""
    work = clone_model(model)
    nodes = list(work.graph)
    originals = [v.name for v in work.graph.outputs]
    exposed: List[Value] = []
    for g in groups:
        v = nodes[g.ln].outputs[0]
        if v.name not in originals and v not in exposed:
            if v.type is None:
                v.type = TensorType(DataType.FLOAT, None)
            exposed.append(v)
    work.graph.outputs = list(work.graph.outputs) + exposed
    results = run_model(work, feeds, outputs=originals + [v.name for v in exposed])
    for g in groups:
        name = nodes[g.ln].outputs[0].name
        amax = np.zeros(g.k, np.float32)
        for r in results:
            a = np.asarray(r[name], np.float32).reshape(-1, g.k)
            if a.size:
                amax = np.maximum(amax, np.nanmax(np.abs(a), axis=0))
        g.amax = amax


def smoothing_factors(amax: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """``s = max(amax, 1e-5)^alpha / max(wmax, 1e-5)^(1 - alpha)``, float32 ``[K]`` (SmoothQuant
    eq. 4); ``amax``/``wmax`` float32 ``[K]``, ``alpha`` in [0, 1]."""
    a = np.maximum(np.asarray(amax, np.float64), CLAMP)
    w = np.maximum(np.asarray(wmax, np.float64), CLAMP)
    return (a ** alpha / w ** (1.0 - alpha)).astype(np.float32)


def apply_smoothing(model: Model, groups: List[SmoothGroup], alpha: float) -> Tuple[int, int]:
    """Rewrite ``model`` in place: each group's MatMul weights ``W`` become ``diag(s) W`` and
    their input ``LN(x) / s``, folded into the LayerNorm's ``gamma``/``beta`` when the group's
    MatMuls are the LayerNorm output's only readers (and it is no graph output), else a
    ``Mul(LN(x), 1/s)`` after the LayerNorm that only the group's MatMuls read.

    Exact in real arithmetic; in float32 the outputs differ by rounding (tested against ONNX
    Runtime on the original to 1e-5 relative). Groups come from :func:`layernorm_groups` on this
    model (or a ``clone_model`` of the model they came from) with ``amax`` set.

    Returns:
        ``(folded, muls)``: groups folded into their LayerNorm, groups given a Mul.
    """
    graph = model.graph
    nodes = list(graph)
    folded = muls = 0
    replaced: List[Value] = []
    for g in groups:
        s = smoothing_factors(g.amax, g.wmax, alpha)
        ln = nodes[g.ln]
        y = ln.outputs[0]
        members = [nodes[p] for p in g.members]
        for node in members:
            w = constant_array(node.inputs[1])
            replaced.append(node.inputs[1])
            node.set_input(1, graph.add_constant((w * s[:, None]).astype(np.float32),
                                                 f"{node.inputs[1].name}_smoothed"))
        readers = {id(n) for n, _ in y.uses()}
        inv = (np.float32(1.0) / s).astype(np.float32)
        if readers == {id(n) for n in members} and not y.is_graph_output():
            gamma = constant_array(ln.inputs[1])
            replaced.append(ln.inputs[1])
            ln.set_input(1, graph.add_constant((gamma * inv).astype(np.float32),
                                               f"{ln.inputs[1].name}_smoothed"))
            if len(ln.inputs) > 2 and ln.inputs[2] is not None:
                beta = constant_array(ln.inputs[2])
                replaced.append(ln.inputs[2])
                ln.set_input(2, graph.add_constant((beta * inv).astype(np.float32),
                                                   f"{ln.inputs[2].name}_smoothed"))
            folded += 1
            continue
        b = Builder(graph, provenance=ln.provenance, insert=False)
        z = b.op("Mul", y, graph.add_constant(inv, f"{y.name}_inv_smooth"),
                 output_names=(f"{y.name}_smoothed",))
        z.type = y.type
        graph.insert_after(ln, b.nodes)
        for node in members:
            node.set_input(0, z)
        muls += 1
    for v in dict.fromkeys(replaced):  # the weights and LayerNorm constants nobody reads now
        if not v.uses() and not v.is_graph_output() and not v.is_graph_input() \
                and v.is_initializer():
            graph.remove_initializer(v.name)
    return folded, muls


__all__ = ["ALPHAS", "SmoothGroup", "activation_absmax", "apply_smoothing", "layernorm_groups",
           "smoothing_factors"]
