"""quantize-weights: weight-only int8 / int4 quantization of MatMul and Gemm weights (LLM decode).

The math (:func:`quantize_blocks`) is round-to-nearest on a grid per output column and block of K:

* ``symmetric=true``: ``scale = w_ext / -2^(bits-1)`` where ``w_ext`` is the block's value of
  largest magnitude, with its sign; codes ``clip(round(w / scale), -2^(bits-1), 2^(bits-1) - 1) +
  2^(bits-1)``, zero point ``2^(bits-1)`` (MatMulNBits' default, so none is stored). ``w_ext``
  lands exactly on the code -2^(bits-1), using all 2^bits levels: llama.cpp's Q4_0 / Q8_0 scale
  choice (ggml-quants.c ``quantize_row_q4_0_ref``: ``d = max / -8``).
* ``symmetric=true, absmax=true``: ``scale = max|w| / (2^(bits-1) - 1) > 0``, codes ``clip(round(w
  / scale), -2^(bits-1), 2^(bits-1) - 1) + 2^(bits-1)`` (in practice within ``+-(2^(bits-1) - 1)``),
  the same zero point: the positive-scale symmetric grid of TensorRT's quantization schemes
  (``x = x_q * s``) and of ``quantize-dynamic``'s weights (``max|w| / 127``). TensorRT's ONNX
  parser refuses a scale <= 0 (onnx-tensorrt ``QuantDequantLinearHelper``: "Scale coefficients
  must all be positive"), and the Q4_0 grid's scale has the sign of ``-w_ext`` (negative for a
  block whose extreme is positive), so the tensorrt form uses this grid.
* ``symmetric=false``: the block's range ``[min(w, 0), max(w, 0)]`` on ``2^bits - 1`` steps,
  ``scale = (max - min) / (2^bits - 1)``, zero point ``round(-min / scale)`` (ONNX Runtime's
  ``MatMul4BitsQuantizer`` asymmetric blockwise quantization; zero stays exactly representable).
* ``symmetric=false, float_zero_points=true``: the block's own ``[min, max]`` on ``2^bits - 1``
  steps with a float zero point ``-min / scale`` (llama.cpp's Q4_1 grid ``w = d * q + m``:
  a Q4_1 model's weights are reproduced exactly at its block of 32).
* ``method=mse``: the same grids with the range shrunk by the factor in 1.0, 0.95, ... 0.75 that
  gives each block the least squared weight error (the weight-clipping search of AWQ, Lin et al.
  2024, section 3.3 ``auto_clip``, measured on the weights instead of calibration activations).

* ``method=gptq``: GPTQ (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for
  Generative Pre-trained Transformers", Algorithm 1 with lazy batch updates and groups): rows of K
  are quantized in order on the grids above (each group's scale from its rows as they are when the
  group starts), and each row's rounding error is spread over the rows not yet quantized through
  the inverse Hessian ``H = 2 X^T X / n + damp`` of the layer's calibration inputs ``X``
  (:func:`layer_hessians`), so ``||X W - X Wq||`` is minimized rather than ``||W - Wq||``.

``block=0`` means one block per column (per-output-channel; padded to a power of 2 rows).

Forms (the pass picks one from the target and emitter; the lowering functions are in
:mod:`passctl.passes.lowering.weight_quant`): ``cpu`` with ``onnxruntime``: ``MatMulNBits``;
a GPU target with ``tensorrt``: ``DequantizeLinear -> MatMul`` (int8 per output channel, int4 in
blocks of 64 or 128 along K at opset 21), symmetric, positive scales, no zero points.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple

import numpy as np

from passctl.ir import Builder, DataType, Model, Node
from passctl.ir.errors import UserError
from passctl.passes._snapshot import clone_model
from passctl.passes.base import PassResult
from passctl.passes.lowering.weight_quant import (DQ_BLOCKED_OPSET, DQ_PER_AXIS_OPSET,
                                                  NBITS_MIN_BLOCK, dq_matmul_blocked,
                                                  dq_matmul_per_channel, matmul_nbits)
from passctl.passes.precision.amp import parse_dims
from passctl.passes.precision.calibrating import CalibratingPass
from passctl.passes.precision.sensitivity import (calibration_inputs, check_search_options,
                                                  output_error, run_model, search_fp32_set)
from passctl.passes.quantize.layers import QuantLayer, find_layers, quantizable_nodes
from passctl.passes.quantize.opset import raise_opset
from passctl.passes.registry import register_pass
from passctl.support.profiles import get_target

logger = logging.getLogger(__name__)

BITS = (4, 8)
BLOCKS = (0, 16, 32, 64, 128, 256)
TENSORRT_INT4_BLOCKS = (64, 128)
"""TensorRT's INT4 block sizes ("The supported block sizes are {64, 128}": TensorRT developer
guide, Quantization Schemes)."""
NBITS, DQ = "MatMulNBits", "DequantizeLinear+MatMul"
"""The forms: ONNX Runtime's contrib op (cpu), standard ONNX for TensorRT."""
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
OUTPUT_RANKING_MAX = 64
UNBUDGETED_CHECK_BOUND = {8: 3e-2, 4: 2e-1}
"""The mean-rel bound ``--check`` applies to quantize-weights without ``budget=``: round-to-nearest
weight error is ~0.6% (int8 per column) and ~10% (int4, block 128) of ||W|| on normal weights,
an output error of about twice that through two layers;
give ``budget=`` to have the pass measure and enforce a bound instead."""


@dataclass
class BlockCodes:
    """A weight ``[K, N]`` quantized per column and block of K.

    Attributes:
        codes: uint8 ``[N, k_blocks, block]`` in ``[0, 2^bits)`` (K padded with zeros' codes).
        scales: float32 ``[N, k_blocks]``.
        zero_points: uint8 ``[N, k_blocks]`` (float32 with ``float_zero_points``), or None for
            the symmetric grid (zero point ``2^(bits-1)``).
        k: the unpadded K; ``bits``; ``block``: the block size used.
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: Optional[np.ndarray]
    k: int
    bits: int
    block: int

    def dequantize(self) -> np.ndarray:
        """float32 ``[K, N]``: ``(code - zero_point) * scale`` (MatMulNBits' dequantization)."""
        zp = (self.zero_points if self.zero_points is not None
              else np.full(self.scales.shape, 2 ** (self.bits - 1), np.uint8))
        w = (self.codes.astype(np.float32) - zp[..., None].astype(np.float32)) \
            * self.scales[..., None]
        return np.ascontiguousarray(w.reshape(w.shape[0], -1)[:, :self.k].T)


def block_size(k: int, block: int) -> int:
    """The MatMulNBits block size: ``block``, or for ``block=0`` (per column) the smallest power
    of 2 >= max(K, 16)."""
    if block:
        return block
    return max(NBITS_MIN_BLOCK, 1 << max(0, int(k - 1).bit_length()))


CHUNK_ELEMENTS = 1 << 22
"""Weight elements quantized per step (:func:`quantize_blocks` works on groups of whole output
columns of about this many elements, so its float32 temporaries are ~16 MiB each whatever the
weight's size: a 4096 x 32000 LM head does not need 0.5 GB per temporary)."""


def quantize_blocks(w: np.ndarray, bits: int, block: int, symmetric: bool = True,
                    method: str = "rtn", float_zero_points: bool = False,
                    scale_dtype=np.float32, absmax: bool = False) -> BlockCodes:
    """Quantize ``w`` ``[K, N]`` (MatMul's B; float32 or float16, possibly a read-only memory
    map) per column ``n`` and block of ``block`` rows of K (the module docstring's grids;
    ``block=0``: one block per column).

    Columns are quantized in groups of about :data:`CHUNK_ELEMENTS` elements, each read from
    ``w`` and converted to float32 on its own, so the memory used beyond the returned codes is
    bounded whatever ``w``'s size. ``scale_dtype``: the type the kernel reads the scales in (its
    ``T1``, the activation's type: float16 for a float16 model); scales are rounded to it before
    the codes are computed, so the codes are those of the stored scales. ``absmax``: with
    ``symmetric``, the positive-scale grid ``max|w| / (2^(bits-1) - 1)`` (module docstring).

    Returns:
        :class:`BlockCodes`; ``dequantize()`` gives the weight the kernel multiplies with.
    """
    k, n = w.shape
    size = block_size(k, block)
    kb = -(-k // size)
    codes = np.empty((n, kb, size), np.uint8)
    scales = np.empty((n, kb), np.float32)
    zero_points = None
    step = max(1, CHUNK_ELEMENTS // (kb * size))
    ratios = CLIP_RATIOS if method == "mse" else (1.0,)
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        wt = np.zeros((c1 - c0, kb * size), np.float32)
        wt[:, :k] = np.asarray(w[:, c0:c1], np.float32).T
        wt = wt.reshape(c1 - c0, kb, size)
        best = None
        for r in ratios:
            q, sc, zps = _grid(wt, bits, symmetric, np.float32(r), float_zero_points, scale_dtype,
                               absmax)
            if len(ratios) == 1:
                best = [q, sc, zps, None]
                break
            zf = (zps if zps is not None else np.full(sc.shape, 2 ** (bits - 1), np.uint8))
            deq = (q.astype(np.float32) - zf[..., None].astype(np.float32)) * sc[..., None]
            err = ((deq - wt) ** 2).sum(-1)
            if best is None:
                best = [q, sc, zps, err]
                continue
            better = err < best[3]
            best[0] = np.where(better[..., None], q, best[0])
            best[1] = np.where(better, sc, best[1])
            if zps is not None:
                best[2] = np.where(better, zps, best[2])
            best[3] = np.minimum(err, best[3])
        codes[c0:c1] = best[0]
        scales[c0:c1] = best[1]
        if best[2] is not None:
            if zero_points is None:
                zero_points = np.empty((n, kb), best[2].dtype)
            zero_points[c0:c1] = best[2]
    return BlockCodes(codes, scales, zero_points, k, bits, size)


def weight_error(c: BlockCodes, w: np.ndarray) -> float:
    """``||W - dequant(codes)||_F / ||W||_F`` (0 for an all-zero W), computed over groups of
    columns (:data:`CHUNK_ELEMENTS`) so that neither W in float32 nor the dequantized weight is
    ever whole in memory."""
    n, kb, size = c.codes.shape
    step = max(1, CHUNK_ELEMENTS // (kb * size))
    num = den = 0.0
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        part = BlockCodes(c.codes[c0:c1], c.scales[c0:c1],
                          None if c.zero_points is None else c.zero_points[c0:c1],
                          c.k, c.bits, c.block).dequantize()
        ref = np.asarray(w[:, c0:c1], np.float32)
        num += float(np.sum((part - ref) ** 2, dtype=np.float64))
        den += float(np.sum(ref.astype(np.float64) ** 2))
    return math.sqrt(num / den) if den > 0 else 0.0


GPTQ_DAMP = 0.1
"""GPTQ's dampening: ``H += 0.1 * mean(diag H) * I`` (the paper's percdamp; 0.01 there, with
~260k calibration tokens; with a few thousand the larger value generalizes better)."""
GPTQ_BATCH = 128
"""Rows of K per lazy batch update (GPTQ's B)."""


def gptq_blocks(w: np.ndarray, hessian: np.ndarray, bits: int, block: int, symmetric: bool = True,
                float_zero_points: bool = False, absmax: bool = False) -> BlockCodes:
    """GPTQ quantization (module docstring) of float32 ``w`` ``[K, N]`` given ``hessian``
    ``[K, K]`` (``sum x x^T`` over calibration rows, any scale). Returns :class:`BlockCodes`
    on the same grids as :func:`quantize_blocks`."""
    w = np.asarray(w, np.float64)
    k, n = w.shape
    size = block_size(k, block)
    kb = -(-k // size)
    h = np.array(hessian, np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    work = np.zeros((kb * size, n), np.float64)
    work[:k] = w
    work[:k][dead] = 0.0
    h += np.eye(k) * GPTQ_DAMP * float(np.mean(np.diag(h)))
    hinv = np.linalg.cholesky(np.linalg.inv(h)).T  # upper Cholesky factor of H^-1
    full = np.eye(kb * size)
    full[:k, :k] = hinv
    hinv = full
    codes = np.zeros((n, kb, size), np.uint8)
    scales = np.zeros((n, kb), np.float32)
    zps = None if symmetric else np.zeros((n, kb), np.float32 if float_zero_points else np.uint8)
    half = 2 ** (bits - 1)
    levels = 2 ** bits
    rows = kb * size
    for start in range(0, rows, GPTQ_BATCH):
        end = min(rows, start + GPTQ_BATCH)
        wb = work[start:end].copy()
        err = np.zeros_like(wb)
        for i in range(end - start):
            r = start + i
            g = r // size
            if r % size == 0:  # a new group: its grid from the rows as they are now
                group = np.concatenate([wb[i:], work[end:(g + 1) * size]])[:size]
                c, sc, zp = _grid(group.T[:, None, :].astype(np.float32), bits, symmetric,
                                  np.float32(1.0), float_zero_points, absmax=absmax)
                scales[:, g] = sc[:, 0]
                if zps is not None:
                    zps[:, g] = zp[:, 0]
            sc = scales[:, g].astype(np.float64)
            if symmetric:
                q = np.clip(np.rint(wb[i] / sc), -half, half - 1) + half
                zf = float(half)
            else:
                zf = zps[:, g].astype(np.float64)
                q = np.clip(np.rint(wb[i] / sc + zf) if float_zero_points
                            else np.rint(wb[i] / sc) + zf, 0, levels - 1)
            codes[:, g, r % size] = q.astype(np.uint8)
            deq = (q - zf) * sc
            e = (wb[i] - deq) / hinv[r, r]
            wb[i + 1:] -= np.outer(hinv[r, r + 1:end], e)
            err[i] = e
        work[end:] -= hinv[start:end, end:].T @ err
    return BlockCodes(codes, scales, zps, k, bits, size)


def layer_hessians(model: Model, layers: List["WeightLayer"], feeds
                   ) -> Dict[int, Tuple[np.ndarray, int]]:
    """``{layer position: (sum over calibration rows of x x^T, rows)}`` (float64 ``[K, K]``) of
    each layer's data input, from one ONNX Runtime run per feed of a copy of ``model`` that
    returns those inputs too (layers reading one value share its matrix)."""
    work = clone_model(model)
    nodes = list(work.graph)
    by_value: Dict[str, List[int]] = {}
    for wl in layers:
        v = nodes[wl.layer.position].inputs[0]
        if v.name not in by_value:
            by_value[v.name] = []
            if not v.is_graph_output():
                work.graph.outputs = list(work.graph.outputs) + [v]
        by_value[v.name].append(wl.layer.position)
    sums: Dict[str, np.ndarray] = {}
    rows: Dict[str, int] = {}
    for r in run_model(work, feeds, optimize=True):
        for name in by_value:
            x = np.asarray(r[name], np.float64)
            x = x.reshape(-1, x.shape[-1])
            sums[name] = sums.get(name, 0) + x.T @ x
            rows[name] = rows.get(name, 0) + x.shape[0]
    return {p: (sums[name], rows[name]) for name, ps in by_value.items() for p in ps}


def _grid(wt: np.ndarray, bits: int, symmetric: bool, ratio: np.float32,
          float_zero_points: bool = False, scale_dtype=np.float32, absmax: bool = False):
    """Codes, scales (rounded to ``scale_dtype``, held as float32) and zero points of blocks
    ``wt`` ``[..., block]`` (float32) on the module docstring's grids; a zero scale becomes 1."""
    levels = 2 ** bits

    def stored(scales):
        scales = np.asarray(scales, np.float32).astype(scale_dtype).astype(np.float32)
        return np.where(scales == 0, np.float32(1), scales).astype(np.float32)

    if symmetric and absmax:
        half = levels // 2
        scales = stored(np.abs(wt).max(-1) * ratio / np.float32(half - 1))
        q = np.clip(np.rint(wt / scales[..., None]), -half, half - 1) + half
        return q.astype(np.uint8), scales, None
    if symmetric:
        half = levels // 2
        idx = np.abs(wt).argmax(-1)[..., None]
        ext = np.take_along_axis(wt, idx, -1)[..., 0] * ratio
        scales = stored(ext / np.float32(-half))
        q = np.clip(np.rint(wt / scales[..., None]), -half, half - 1) + half
        return q.astype(np.uint8), scales, None
    if float_zero_points:
        lo, hi = wt.min(-1) * ratio, wt.max(-1) * ratio
        scales = stored((hi - lo) / np.float32(levels - 1))
        zp = (-lo / scales).astype(scale_dtype).astype(np.float32)
        q = np.clip(np.rint(wt / scales[..., None] + zp[..., None]), 0, levels - 1)
        return q.astype(np.uint8), scales, zp
    lo = np.minimum(wt.min(-1), 0) * ratio
    hi = np.maximum(wt.max(-1), 0) * ratio
    scales = stored((hi - lo) / np.float32(levels - 1))
    zp = np.clip(np.rint(-lo / scales), 0, levels - 1)
    q = np.clip(np.rint(wt / scales[..., None]) + zp[..., None], 0, levels - 1)
    return q.astype(np.uint8), scales, zp.astype(np.uint8)


@dataclass
class WeightLayer:
    """A MatMul / Gemm whose constant weight can be read by MatMulNBits.

    ``w`` is ``[K, N]`` as stored: float32 or float16, for external data a memory map that is
    not read until the layer is quantized (a Gemm's transposed B when transB=1, times ``alpha``,
    is a float32 copy); ``has_bias``: the Gemm has a C ``[N]``; ``external``: the weight's data
    is in a file (its codes are then spilled to one too, :func:`passctl.ir.spill`)."""

    layer: QuantLayer
    w: Optional[np.ndarray]
    has_bias: bool
    external: bool = False
    shape: Tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        self.shape = tuple(int(d) for d in self.w.shape)

    def release(self) -> None:
        """Drop the weight (its memory map, and the pages it made resident, go with it)."""
        self.w = None
        self.layer.weight = None


def cpu_onnxruntime_only(owner: str, target, emitter: str, hint: str) -> None:
    """Refuse a target or emitter other than ONNX Runtime on the CPU (the only home of the
    MatMulNBits / DynamicQuantizeMatMul kernels these passes lower to).

    Raises:
        UserError: a GPU target or another emitter; ``hint`` says what to do instead.
    """
    if target.is_gpu or emitter != "onnxruntime":
        raise UserError(f"{owner}: lowering is built for ONNX Runtime on the cpu; target "
                        f"{target.name} / emitter {emitter} has no form; {hint}")


def parse_exclude(model: Model, text: str, owner: str) -> List[str]:
    """The ``exclude`` option (comma- or semicolon-separated node names, op types or provenance
    names) as a list, each entry checked against the model's MatMul/Gemm nodes.

    Raises:
        UserError: an entry names no quantizable node.
    """
    exclude = [e.strip() for e in text.replace(";", ",").split(",") if e.strip()]
    known = set()
    for nm, n in quantizable_nodes(model.graph):
        known.update((nm, n.name, n.op_type, *n.provenance))
    for e in exclude:
        if e not in known:
            raise UserError(f"{owner}: exclude entry '{e}' names no MatMul/Gemm node of the "
                            "model; give a node name or op type")
    return exclude


def _weight_layers(model: Model, exclude: List[str]) -> Tuple[List[WeightLayer], Dict[str, str]]:
    layers, skipped = find_layers(model.graph, exclude, (DataType.FLOAT, DataType.FLOAT16))
    nodes = list(model.graph)
    found: List[WeightLayer] = []
    why: Dict[str, str] = {k: v.why for k, v in skipped.items() if v.op in ("MatMul", "Gemm")}
    for l in layers:
        if l.op not in ("MatMul", "Gemm"):
            continue
        node = nodes[l.position]
        data = node.inputs[0]
        rank = None if data.shape is None else data.shape.rank
        if l.op == "MatMul":
            if rank is not None and rank < 2:
                why[l.name] = "its data input is 1-D"
                continue
            found.append(WeightLayer(l, l.weight, False, _is_external(node.inputs[1])))
            continue
        if node.attr("transA", 0) or float(node.attr("beta", 1.0)) != 1.0:
            why[l.name] = "Gemm with transA=1 or beta != 1"
            continue
        w = l.weight.T if node.attr("transB", 0) else l.weight
        w = np.ascontiguousarray(w * np.float32(node.attr("alpha", 1.0)), np.float32)
        c = node.inputs[2] if len(node.inputs) > 2 else None
        if c is not None and (c.shape is None or tuple(c.shape) != (w.shape[1],)):
            why[l.name] = "Gemm whose C is not a [N] bias"
            continue
        found.append(WeightLayer(l, w, c is not None, _is_external(node.inputs[1])))
    return found, why


def _is_external(v) -> bool:
    return v is not None and v.const is not None and v.const.external is not None


def apply_nbits(model: Model, chosen: List[WeightLayer], codes: Dict[int, BlockCodes],
                accuracy_level: int, form: str = NBITS) -> int:
    """Replace each chosen MatMul / Gemm (by position) by ``form`` (:data:`NBITS`: MatMulNBits;
    :data:`DQ`: DequantizeLinear -> MatMul, per channel for 8 bits, blocked for 4) reading its
    codes; the float weight is dropped when nothing else reads it. Returns the number of nodes
    replaced."""
    nodes = list(model.graph)
    for wl in chosen:
        _apply_one(model, nodes[wl.layer.position], wl, codes[wl.layer.position], accuracy_level,
                   form)
    return len(chosen)


def _apply_one(model: Model, node: Node, wl: WeightLayer, c: BlockCodes,
               accuracy_level: int, form: str = NBITS) -> None:
    """:func:`apply_nbits` for one node. Codes of a weight held in external data are spilled to
    a file (:func:`passctl.ir.spill`), so a model's quantized weights are never all in memory."""
    graph = model.graph
    b = Builder(graph, provenance=node.provenance, insert=False)
    bias = node.inputs[2] if wl.has_bias else None
    old_w = node.inputs[1]
    base = (node.name or wl.layer.name).replace("/", "_")
    if form == DQ:
        names = (node.outputs[0].name + "_dq",)
        y = (dq_matmul_per_channel(b, model, node.inputs[0], c.codes, c.scales, c.k, bias, base,
                                   names, wl.external) if c.bits == 8 else
             dq_matmul_blocked(b, model, node.inputs[0], c.codes, c.scales, c.k, c.block, bias,
                               base, names, wl.external))
    else:
        y = matmul_nbits(b, model, node.inputs[0], c.codes, c.scales, c.zero_points, c.k,
                         c.bits, c.block, accuracy_level, bias, base=base,
                         output_names=(node.outputs[0].name + "_nbits",), spill=wl.external)
    if y.type is None:
        y.type = node.outputs[0].type
    graph.replace_nodes([node], b.nodes, [node.outputs[0]], [y])
    if not old_w.uses() and not old_w.is_graph_output() and old_w.is_initializer() \
            and not old_w.is_graph_input():
        graph.remove_initializer(old_w.name)


@register_pass
class QuantizeWeights(CalibratingPass):
    """Weight-only quantization of MatMul / Gemm weights to int8 (per output channel) or int4
    (blocks of K), lowered to ONNX Runtime's ``com.microsoft.MatMulNBits`` (``cpu`` target,
    ``onnxruntime`` emitter) or to standard ONNX ``DequantizeLinear -> MatMul`` for TensorRT (a GPU
    target with ``--emit tensorrt``).

    Rules:
      1. Layers: MatMul with a constant float32 2-D B ``[K, N]`` and Gemm (transA=0, beta=1, C
         absent or ``[N]``; transB and alpha folded into the weight) with a float32 data input
         (``passctl.passes.quantize.layers.find_layers``); ``exclude`` names nodes or op types
         that stay float32. A weight also read elsewhere (a tied embedding's Gather) keeps its
         float32 copy for those readers.
      2. Codes: :func:`quantize_blocks` (module docstring: round-to-nearest, symmetric Q4_0-style
         or asymmetric with zero points; ``method=mse`` searches a clipping ratio per block).
         ``bits=8`` defaults to ``block=64``, ``bits=4`` to ``block=128`` (``block=0``: one
         block per output column).
      3. Activations stay float32; ``accuracy_level`` is MatMulNBits' attribute (default 4:
         A quantized to int8 per block at run time, integer dot products, ONNX Runtime's fast
         path; SmolLM2 decode int4 3.9x, int8 2.6x fp32's tokens/s).
      4. Budget: none by default (every layer quantized, no model run: what streams on a 7B
         model). With ``budget=``, the all-quantized model's output error on the calibration
         feeds (``calib=`` or seeded random ones, amp's ``output_error`` under ``metric``) is
         measured as shipped (``ORT_ENABLE_ALL``); while over it, layers return to float32 in
         order of their model-output error alone (one run per layer up to 64 layers, else their
         relative weight error; ``sensitivity=layer``: their calibration output error), the
         fewest leading ones found by amp's ``search_fp32_set``; ``fallback=int8`` returns them
         to 8 bits instead.
      5. ``awq=true``: AWQ scales folded into the graph before quantizing
         (:mod:`passctl.passes.quantize.awq`).

    TensorRT form (``passctl.passes.lowering.weight_quant.dq_matmul_per_channel`` /
    ``dq_matmul_blocked``; sources there): int8 is one scale per output column
    (``DequantizeLinear(int8 [K, N], scale [N], axis=1)``, block quantization being INT4-only in
    TensorRT), int4 is ``DequantizeLinear(INT4 [K, N], scale [K / block, N], axis=0,
    block_size=block)`` at opset 21 (the model is converted up with onnx's version converter),
    block 64 or 128. TensorRT requires zero points of 0 and scales > 0, so the grid is the
    positive-scale symmetric one (``absmax``, module docstring); a layer whose K is not a multiple
    of the int4 block stays float32 (the parser infers the block from the shapes). Refused with
    one line: ``symmetric=false`` / ``float_zero_points``, ``absmax=false``, ``accuracy_level``
    (MatMulNBits' attribute), ``bits=8`` with a block, ``bits=4`` with a block other than 64/128.

    Statistics: ``form``, ``bits``, ``block``, ``symmetric``, ``absmax``, ``method``,
    ``accuracy_level`` (None for the TensorRT form),
    ``quantized_layers``, ``float_layers``, ``layers`` (name, op, K, N, bits, block,
    ``weight_error``: ||W - Wq||_F / ||W||_F, ``output_error`` when measured, ``why`` for float
    ones), ``weight_bytes`` (before, after), and with a budget ``budget``, ``metric``,
    ``error``, ``within_budget``, ``search``.

    Raises:
        UserError: bad options; a target / emitter pair without a form (a GPU target with the
            onnxruntime or tvm emitter, the cpu with another emitter); an option the TensorRT
            form cannot write.
    """

    name = "quantize-weights"
    summary = ("Weight-only int8/int4 MatMul weights (MatMulNBits, or DequantizeLinear for "
               "TensorRT), optional accuracy budget")
    budget_label = "quantize-weights"
    _form = NBITS
    _absmax = False
    output_metric: Optional[Callable[[list, list, list], float]] = None
    """A caller's model-output error for the budget in place of ``metric``: ``(feeds, reference
    outputs, candidate outputs) -> error``, its ``__name__`` reported as the metric
    (``quantize_decoder``'s ``metric="ppl"``); not a pipeline option."""

    @dataclass
    class Options:
        """Options of quantize-weights.

        Attributes:
            bits: 8 or 4.
            block: block of K per scale: 16, 32, 64, 128, 256, or 0 (one per column, padded
                to a power of 2); None: 64 for 8 bits, 128 for 4 bits (per column with int8
                compute cost SmolLM2 +4.4% perplexity, block 64 -0.2%).
            symmetric: symmetric grid without zero points (true) or with them (false).
            absmax: with ``symmetric``, the positive-scale grid ``max|w| / (2^(bits-1) - 1)``
                instead of Q4_0's ``w_ext / -2^(bits-1)``; None: true for TensorRT (it requires
                scales > 0), false otherwise.
            float_zero_points: with ``symmetric=false``, float zero points on the block's own
                [min, max] (llama.cpp Q4_1's grid) instead of uint8 ones.
            method: ``rtn`` (round to nearest), ``mse`` (per-block clipping search) or
                ``gptq`` (error compensation from the calibration feeds' layer inputs).
            accuracy_level: MatMulNBits' attribute (0-4; 4: int8 compute); None: 4 (levels 0-3
                run ONNX Runtime 1.32's 8-bit and float-zero-point kernels 10-20x slower than
                fp32 at decode: docs/quantize-weights.md).
            budget: largest model-output error allowed under ``metric``; None: no budget.
            metric: ``max-rel``, ``mean-rel`` or ``cosine``.
            calib, samples, seed, dims: calibration feeds as for amp / quantize.
            exclude: node names or op types that stay float32 (``;``-separated).
            sensitivity: ranking for the budget: ``output`` (model-output error with only that
                layer quantized, one run per layer), ``weight`` (relative weight error, no run),
                ``layer`` (the layer's own calibration output error ``||X W - X Wq|| / ||X W||``,
                from one calibration run, the one ``awq`` makes) or ``auto`` (``output`` up to 64
                layers, else ``layer`` with ``awq``, else ``weight``).
            awq: AWQ scales (:mod:`passctl.passes.quantize.awq`, Lin et al. 2024) from the
                calibration feeds, folded into the preceding norm / MatMul, before quantizing.
            fallback: what a layer the budget returns becomes: ``float`` (float32) or ``int8``
                (bits=4 only: MatMulNBits 8 bits, block 64; per column for TensorRT).
            target: target profile name (default: the compile context's).
        """

        bits: int = 4
        block: Optional[int] = None
        symmetric: bool = True
        absmax: Optional[bool] = None
        float_zero_points: bool = False
        method: Literal["rtn", "mse", "gptq"] = "rtn"
        accuracy_level: Optional[int] = None
        budget: Optional[float] = None
        metric: Literal["max-rel", "mean-rel", "cosine"] = "mean-rel"
        calib: str = ""
        samples: int = 2
        seed: int = 0
        dims: str = ""
        exclude: str = ""
        sensitivity: Literal["auto", "output", "weight", "layer"] = "auto"
        awq: bool = False
        fallback: Literal["float", "int8"] = "float"
        target: str = "cpu"

        def __post_init__(self) -> None:
            """Raises UserError: bits not 4/8, a block not in :data:`BLOCKS`, accuracy_level
            outside 0-4, an unknown method, or a bad budget/samples/metric."""
            if self.bits not in BITS:
                raise UserError(f"quantize-weights: bits={self.bits}; use 4 or 8")
            if self.block is not None and self.block not in BLOCKS:
                raise UserError(f"quantize-weights: block={self.block}; use one of "
                                f"{', '.join(map(str, BLOCKS))} (0: one block per column)")
            if self.block == 0 and self.bits == 4:
                raise UserError("quantize-weights: block=0 (per column) is for bits=8; give "
                                "bits=4 a block of 32, 64 or 128")
            if self.accuracy_level is not None and not 0 <= self.accuracy_level <= 4:
                raise UserError(f"quantize-weights: accuracy_level={self.accuracy_level}; use "
                                "0-4 (4: int8 compute)")
            if self.float_zero_points and self.symmetric:
                raise UserError("quantize-weights: float_zero_points=true needs symmetric=false")
            if self.absmax and not self.symmetric:
                raise UserError("quantize-weights: absmax=true is a symmetric grid; drop "
                                "symmetric=false or absmax=true")
            if self.method not in ("rtn", "mse", "gptq"):
                raise UserError(f"quantize-weights: method={self.method}; use rtn, mse or gptq")
            if self.fallback not in ("float", "int8"):
                raise UserError(f"quantize-weights: fallback={self.fallback}; use float or int8")
            if self.fallback == "int8" and self.bits == 8:
                raise UserError("quantize-weights: fallback=int8 is for bits=4; drop it")
            if self.sensitivity not in ("auto", "output", "weight", "layer"):
                raise UserError(f"quantize-weights: sensitivity={self.sensitivity}; use auto, "
                                "output, weight or layer")

            if self.budget is not None:
                check_search_options("quantize-weights", self.budget, self.samples,
                                     self.metric, "1e-2")

    def configure(self, context) -> List[str]:
        """:meth:`CalibratingPass.configure`, then refuse (before any pass runs) a target /
        emitter without a form or an option the form cannot write (:meth:`form`)."""
        notes = super().configure(context)
        if context.target is not None or context.emitter:
            self.form()
        return notes

    def form(self) -> str:
        """The form for the options' target and the emitter: :data:`NBITS` (cpu, onnxruntime)
        or :data:`DQ` (a GPU target, tensorrt).

        Raises:
            UserError: one line: no form for the pair, or an option TensorRT cannot take.
        """
        o = self.options
        target = get_target(o.target)
        emitter = self._emitter or target.default_emitter
        if not target.is_gpu and emitter == "onnxruntime":
            return NBITS
        if not (target.is_gpu and emitter == "tensorrt"):
            raise UserError(f"quantize-weights: target {target.name} / emitter {emitter} has no "
                            "form; use --target cpu (MatMulNBits, ONNX Runtime) or a GPU target "
                            "with --emit tensorrt (DequantizeLinear + MatMul)")
        why = None
        if not o.symmetric:
            why = ("symmetric=false writes zero points, and TensorRT takes DequantizeLinear with "
                   "zero points of 0 only; drop symmetric=false")
        elif o.absmax is False:
            why = ("absmax=false is the Q4_0 grid, whose scales can be negative, and TensorRT "
                   "requires scales > 0; drop absmax=false")
        elif o.accuracy_level is not None:
            why = "accuracy_level is MatMulNBits' attribute (ONNX Runtime); drop it"
        elif o.bits == 8 and o.block not in (None, 0):
            why = (f"bits=8 with block={o.block}: TensorRT's int8 DequantizeLinear is per "
                   "channel (block quantization is INT4 only); give block=0 or no block")
        elif o.bits == 4 and o.block is not None and o.block not in TENSORRT_INT4_BLOCKS:
            why = (f"bits=4 with block={o.block}: TensorRT's INT4 block sizes are 64 and 128; "
                   "give block=64 or block=128")
        if why:
            raise UserError(f"quantize-weights for --emit tensorrt (target {target.name}): {why}")
        return DQ

    def error_budget(self) -> Optional[Tuple[str, float, str]]:
        """``(metric, budget, label)`` for the numeric check; without ``budget``, mean-rel
        :data:`UNBUDGETED_CHECK_BOUND` of the bits (the pass measured nothing to bound it by)."""
        o = self.options
        if o.budget is None:
            return "mean-rel", UNBUDGETED_CHECK_BOUND[o.bits], self.budget_label
        return o.metric, float(o.budget), self.budget_label

    def run(self, model: Model) -> PassResult:
        o = self.options
        form = self.form()
        self._form = form
        if form == DQ:
            block = o.block if o.block is not None else (0 if o.bits == 8 else 128)
            level = None
            self._absmax = True
        else:
            block = o.block if o.block is not None else (64 if o.bits == 8 else 128)
            level = o.accuracy_level if o.accuracy_level is not None else 4
            self._absmax = bool(o.absmax)
        exclude = parse_exclude(model, o.exclude, self.name)
        start = time.perf_counter()
        stats: Dict[str, Any] = {"form": form, "bits": o.bits, "block": block or "per-column",
                                 "symmetric": o.symmetric, "absmax": self._absmax,
                                 "method": o.method, "accuracy_level": level}
        if form == DQ:
            need = DQ_BLOCKED_OPSET if o.bits == 4 else DQ_PER_AXIS_OPSET
            if model.opset < need and quantizable_nodes(model.graph):
                stats["opset"] = [raise_opset(model, need, self.name,
                                              "the TensorRT form (DequantizeLinear"
                                              + (" with block_size)" if o.bits == 4 else
                                                 " per channel)")), need]
        layers, why_not = _weight_layers(model, exclude)
        layer_err: Dict[int, float] = {}
        if (o.awq or o.sensitivity == "layer") and layers:
            layer_err = self._awq(model, layers, block, stats)
            layers, why_not = _weight_layers(model, exclude)  # the scaled weights
        if form == DQ and o.bits == 4:
            kept = []
            for wl in layers:
                if wl.shape[0] % block:
                    why_not[wl.layer.name] = (f"K={wl.shape[0]} is not a multiple of block "
                                              f"{block} (TensorRT infers the block from the "
                                              "shapes)")
                else:
                    kept.append(wl)
            layers = kept
        rtn_fallback: List[str] = []
        before = sum(wl.w.nbytes for wl in layers)
        size_of = _dq_bytes if form == DQ else _nbits_bytes
        fallback: Dict[int, BlockCodes] = {}
        if o.budget is None and o.method != "gptq":
            # Every layer quantized, no model run: one layer at a time (read, quantize, lower,
            # drop), so a 7B model's weights are never all in memory (issue 18, "streams").
            werr, after, codes = self._stream(model, layers, block, level)
            stats["quantize_seconds"] = round(time.perf_counter() - start, 3)
            chosen, alone, why = layers, {}, {}
        else:
            codes, werr = self._codes(model, layers, block, stats, rtn_fallback)
            stats["quantize_seconds"] = round(time.perf_counter() - start, 3)
            if rtn_fallback:
                stats["gptq_rtn_fallback"] = rtn_fallback
            chosen, alone, why = layers, {}, {}
            if o.budget is not None and layers:
                if o.fallback == "int8":
                    fallback = {wl.layer.position: quantize_blocks(
                        wl.w, 8, 0 if form == DQ else 64, True, "rtn", False, _scale_dtype(wl),
                        self._absmax) for wl in layers}
                chosen, alone, why = self._search(model, layers, codes, werr, stats, level,
                                                  layer_err, fallback)
            back = [wl for wl in layers if wl not in chosen and fallback]
            after = sum(size_of(codes[wl.layer.position], np.dtype(_scale_dtype(wl)).itemsize)
                        if wl in chosen else
                        size_of(fallback[wl.layer.position], np.dtype(_scale_dtype(wl)).itemsize)
                        if wl in back else wl.w.nbytes
                        for wl in layers)
            apply_nbits(model, chosen, codes, level, form)
            apply_nbits(model, back, fallback, level, form)
        rows: List[Dict[str, Any]] = [{"name": k, "bits": 32, "why": v} for k, v in why_not.items()]
        for wl in layers:
            p = wl.layer.position
            low = fallback.get(p) if p in why else codes[p]
            shown = codes[p] if low is None else low
            row = {"name": wl.layer.name, "op": wl.layer.op, "K": wl.shape[0],
                   "N": wl.shape[1], "bits": low.bits if low is not None else 32,
                   "block": ("per-column" if form == DQ and shown.bits == 8 else shown.block),
                   "weight_error": _round(weight_error(low, wl.w) if low is not None
                                          and low is not codes[p] else werr[p])}
            if p in layer_err:
                row["layer_error"] = _round(layer_err[p])
            if p in alone:
                row["output_error"] = _round(alone[p])
            if p in why:
                row["why"] = why[p]
            rows.append(row)
        if fallback:
            stats["fallback_layers"] = len(layers) - len(chosen)
        stats.update(quantized_layers=len(chosen),
                     float_layers=len(rows) - len(chosen) - (len(layers) - len(chosen)
                                                             if fallback else 0),
                     layers=rows, weight_bytes=[int(before), int(after)])
        logger.info("quantize-weights: %d of %d layers int%d (%s)", len(chosen), len(layers),
                    o.bits, form)
        return PassResult(bool(chosen), stats)

    def _stream(self, model: Model, layers: List[WeightLayer], block: int, level: int):
        """Quantize and lower the layers one by one, each weight released once its node is
        replaced. Returns ``({position: weight error}, bytes after, {position: codes summary})``
        (the summary keeps only the block size; the codes themselves are in the graph)."""
        o = self.options
        nodes = list(model.graph)
        werr: Dict[int, float] = {}
        kept: Dict[int, BlockCodes] = {}
        after = 0
        for wl in layers:
            p = wl.layer.position
            c = quantize_blocks(wl.w, o.bits, block, o.symmetric, o.method, o.float_zero_points,
                                _scale_dtype(wl), self._absmax)
            werr[p] = weight_error(c, wl.w)
            after += (_dq_bytes if self._form == DQ else _nbits_bytes)(
                c, np.dtype(_scale_dtype(wl)).itemsize)
            _apply_one(model, nodes[p], wl, c, level, self._form)
            # Fresh empty arrays, not c.codes[:0]: a slice is a view that keeps the whole
            # codes array (K * N bytes, one per int4 code) alive, 6.7 GB over a 7B model.
            kept[p] = BlockCodes(np.empty((0,) + c.codes.shape[1:], c.codes.dtype),
                                 np.empty((0,) + c.scales.shape[1:], c.scales.dtype), None,
                                 c.k, c.bits, c.block)
            wl.release()
            del c
        return werr, after, kept

    def _codes(self, model: Model, layers: List[WeightLayer], block: int, stats, rtn_fallback):
        """Codes of every layer, all in memory (the budget search and GPTQ need them at once)."""
        o = self.options
        if o.method == "gptq" and layers:
            feeds = calibration_inputs(model, o.calib, o.samples, o.seed,
                                       parse_dims(o.dims, self.name), owner=self.name)
            hessians = layer_hessians(model, layers, feeds)
            stats["calibration_feeds"] = len(feeds)
            codes = {}
            for wl in layers:  # fewer calibration rows than K: H is singular, round to nearest
                h, rows = hessians[wl.layer.position]
                codes[wl.layer.position] = (
                    gptq_blocks(wl.w, h, o.bits, block, o.symmetric, o.float_zero_points,
                                self._absmax)
                    if rows >= wl.w.shape[0] else
                    quantize_blocks(wl.w, o.bits, block, o.symmetric, "rtn", o.float_zero_points,
                                    _scale_dtype(wl), self._absmax))
                if rows < wl.w.shape[0]:
                    rtn_fallback.append(wl.layer.name)
        else:
            codes = {wl.layer.position: quantize_blocks(wl.w, o.bits, block, o.symmetric,
                                                        o.method, o.float_zero_points,
                                                        _scale_dtype(wl), self._absmax)
                     for wl in layers}
        werr = {wl.layer.position: weight_error(codes[wl.layer.position], wl.w) for wl in layers}
        return codes, werr

    def _search(self, model, layers, codes, werr, stats, accuracy_level, layer_err, fallback):
        """The budget search: ``(layers kept at bits, {position: error alone}, {position: why
        returned})``; returned layers become ``fallback``'s codes (float32 when empty)."""
        o = self.options
        feeds, reference, level = self.reference_run(model, parse_dims(o.dims, self.name))
        start = time.perf_counter()

        def error_of(subset, n=len(feeds)):
            trial = clone_model(model)
            apply_nbits(trial, subset, codes, accuracy_level, self._form)
            if fallback:
                apply_nbits(trial, [wl for wl in layers if wl not in subset], fallback,
                            accuracy_level, self._form)
            got = run_model(trial, feeds[:n], optimize=level)
            if self.output_metric is not None:
                return self.output_metric(feeds[:n], reference[:n], got)
            return output_error(reference[:n], got, o.metric)

        all_low = error_of(layers)
        alone: Dict[int, float] = {}
        rank = {wl.layer.position: werr[wl.layer.position] for wl in layers}
        sensitivity = o.sensitivity
        if sensitivity == "auto":
            sensitivity = ("output" if len(layers) <= OUTPUT_RANKING_MAX else
                           "layer" if layer_err else "weight")
        if all_low > o.budget and sensitivity == "output":
            # over OUTPUT_RANKING_MAX layers (asked for explicitly): the first feed only
            n = len(feeds) if len(layers) <= OUTPUT_RANKING_MAX else 1
            alone = {wl.layer.position: error_of([wl], n) for wl in layers}
            rank = alone
        elif sensitivity == "layer":
            rank = {wl.layer.position: layer_err.get(wl.layer.position, werr[wl.layer.position])
                    for wl in layers}
        ranking = sorted(layers, key=lambda wl: (-rank[wl.layer.position], wl.layer.position))
        result = search_fp32_set(ranking, lambda k: error_of(ranking[k:]), o.budget,
                                 {0: all_low})
        error, within = result.error, result.within_budget
        if fallback and result.count == len(layers):  # every layer int8: measured, not 0
            error = error_of([])
            result.history.append((result.count, error))
            within = error <= o.budget
        stats.update(budget=o.budget, metric=getattr(self.output_metric, "__name__", o.metric),
                     measured_with=level,
                     calibration_feeds=len(feeds), error=_round(error),
                     within_budget=within and not math.isnan(error),
                     search={"seconds": round(time.perf_counter() - start, 3),
                             "sensitivity": "output" if alone else sensitivity if
                             sensitivity == "layer" else "weight",
                             "fallback": o.fallback,
                             "history": [[k, _round(e)] for k, e in result.history]})
        why = {wl.layer.position: f"measured sensitivity (rank {r + 1})"
               for r, wl in enumerate(ranking[:result.count])}
        return ranking[result.count:], alone, why

    def _awq(self, model: Model, layers: List[WeightLayer], block: int, stats) -> Dict[int, float]:
        """AWQ (:mod:`passctl.passes.quantize.awq`): scales searched per group of layers on the
        calibration feeds and folded into ``model`` (with ``awq=false``, for
        ``sensitivity=layer``, only measured). Returns ``{position: the layer's relative
        calibration output error}`` at the chosen scales (alpha 0 for layers not folded)."""
        from passctl.passes.quantize import awq

        o = self.options
        feeds = calibration_inputs(model, o.calib, o.samples, o.seed,
                                   parse_dims(o.dims, self.name), owner=self.name)
        start = time.perf_counter()
        groups = awq.collect(model, awq.find_groups(model, [wl.layer.position for wl in layers]),
                             feeds, o.seed)
        if not o.awq:  # sensitivity=layer alone: every layer measured at alpha 0, none scaled
            for g in groups:
                g.fold = "none"
        nodes = list(model.graph)
        weights = {m: awq.layer_weight(nodes[m]) for g in groups for m in g.members}

        def dequantized(w):
            return quantize_blocks(w, o.bits, block, o.symmetric, "rtn", o.float_zero_points,
                                   np.float32, self._absmax).dequantize()

        errors = awq.search(groups, weights, dequantized)
        folded = awq.fold(model, groups)
        stats["awq" if o.awq else "layer_calibration"] = {
            "calibration_feeds": len(feeds), "groups": len(groups), "folded": folded,
            "seconds": round(time.perf_counter() - start, 3),
            "alpha": {nodes[g.members[0]].name or str(g.members[0]): g.alpha
                      for g in groups if g.fold != "none"}}
        return errors


def _scale_dtype(wl: WeightLayer):
    """The type of MatMulNBits' scales for the layer: its T1, float16 for a float16 layer."""
    return np.float16 if wl.w.dtype == np.float16 else np.float32


def _nbits_bytes(c: BlockCodes, scale_bytes: int = 4) -> int:
    """Bytes MatMulNBits stores for ``c``: packed codes, scales of ``scale_bytes`` each (the
    activation's type), zero points (packed uint8, or floats like the scales)."""
    n, kb, size = c.codes.shape
    zp = 0 if c.zero_points is None else (
        c.zero_points.size * scale_bytes if c.zero_points.dtype == np.float32
        else n * -(-kb * c.bits // 8))
    return n * kb * size * c.bits // 8 + c.scales.size * scale_bytes + zp


def _dq_bytes(c: BlockCodes, scale_bytes: int = 4) -> int:
    """Bytes the DequantizeLinear form stores for ``c``: K x N codes of ``bits`` (INT4 packed two
    per byte) and the scales (no zero points)."""
    n = c.codes.shape[0]
    return -(-c.k * n * c.bits // 8) + c.scales.size * scale_bytes


def _round(x: float) -> Any:
    return float(f"{x:.4g}") if math.isfinite(x) else str(x)


__all__ = ["DQ", "NBITS", "BlockCodes", "QuantizeWeights", "apply_nbits", "block_size",
           "quantize_blocks"]
