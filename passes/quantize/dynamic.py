"""quantize-dynamic: dynamic int8 MatMuls for the cpu target (activations quantized at run time)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional

import numpy as np

from passctl.ir import Builder, Model, Node, Value
from passctl.ir.errors import UserError
from passctl.passes._snapshot import clone_model
from passctl.passes.base import PassResult
from passctl.passes.lowering.weight_quant import dynamic_quantize_matmul, matmul_integer
from passctl.passes.precision.amp import parse_dims
from passctl.passes.precision.calibrating import CalibratingPass
from passctl.passes.precision.sensitivity import (calibration_inputs, check_search_options,
                                                  output_error, run_model, search_fp32_set)
from passctl.passes.quantize.layers import constant_array
from passctl.passes.quantize.scales import quantize_weight, weight_scales
from passctl.passes.quantize.smooth import (ALPHAS, activation_absmax, apply_smoothing,
                                            layernorm_groups)
from passctl.passes.quantize.weights import (WeightLayer, _weight_layers, cpu_onnxruntime_only,
                                             parse_exclude)
from passctl.passes.registry import register_pass
from passctl.support.cpu_isa import WEIGHT_QMAX_EXACT, WEIGHT_QMAX_NO_SATURATION
from passctl.support.profiles import get_target

logger = logging.getLogger(__name__)

OUTPUT_RANKING_MAX = 64
FORMS = ("dqmm", "integer")


def _bias_add(node: Node, n: int) -> Optional[Node]:
    """The Add that is the only reader of ``node``'s output and adds a constant float32 ``[N]``
    (the Linear layer's bias), else None."""
    y = node.outputs[0]
    uses = y.uses()
    if len(uses) != 1 or y.is_graph_output():
        return None
    add, i = uses[0]
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
        return None
    c = constant_array(add.inputs[1 - i])
    if c is None or c.dtype != np.float32 or c.shape != (n,):
        return None
    return add


def apply_dynamic(model: Model, chosen: List[WeightLayer], qmax: int, form: str) -> int:
    """Replace each chosen MatMul / Gemm (and its bias Add) by ``form``: ``dqmm``
    (``com.microsoft.DynamicQuantizeMatMul``) or ``integer`` (``DynamicQuantizeLinear ->
    MatMulInteger -> Cast -> Mul``); weights symmetric int8 per column, ``max |w| / qmax``.
    Returns the number of bias Adds absorbed."""
    graph = model.graph
    nodes = list(graph)
    absorbed = 0
    for wl in chosen:
        node: Node = nodes[wl.layer.position]
        n = wl.w.shape[1]
        scales = weight_scales(wl.w, 1, qmax)
        codes = quantize_weight(wl.w, scales, 1, qmax)
        old: List[Node] = [node]
        last: Value = node.outputs[0]
        bias = node.inputs[2] if wl.has_bias else None
        add = _bias_add(node, n) if bias is None else None
        if add is not None:
            bias = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
            old.append(add)
            last = add.outputs[0]
            absorbed += 1
        b = Builder(graph, provenance=[p for o in old for p in o.provenance], insert=False)
        base = (node.name or wl.layer.name).replace("/", "_")
        build = dynamic_quantize_matmul if form == "dqmm" else matmul_integer
        y = build(b, model, node.inputs[0], codes, scales, bias, base=base,
                  output_names=(last.name + "_dyn",))
        if y.type is None:
            y.type = last.type
        old_w = node.inputs[1]
        graph.replace_nodes(old, b.nodes, [last], [y])
        if not old_w.uses() and not old_w.is_graph_output() and old_w.is_initializer() \
                and not old_w.is_graph_input():
            graph.remove_initializer(old_w.name)
    return absorbed


@register_pass
class QuantizeDynamic(CalibratingPass):
    """Dynamic int8 MatMuls on the cpu target: weights int8 per output column (symmetric, zero
    point 0), activations quantized to uint8 at run time per tensor by the kernel, under an
    accuracy budget.

    Rules:
      1. Layers: MatMul with a constant float32 2-D B and Gemm (transA=0, beta=1, C absent or
         ``[N]``), as quantize-weights finds them; ``exclude`` keeps nodes / op types float32.
         A MatMul whose only reader adds a constant ``[N]`` (the bias) takes the Add in.
      2. Form: the standard ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (-> Add)``
         (``form=integer``, default: what ``onnxruntime.quantization.quantize_dynamic`` writes,
         which ONNX Runtime's MatMulIntegerToFloat fusion rewrites at ORT_ENABLE_ALL), or
         ``com.microsoft.DynamicQuantizeMatMul(A, B int8, b_scale [N], b_zero_point, bias)``
         (``form=dqmm``). benchmarks/quantize_dynamic.py measures both: the integer form was
         faster in 4 of 5 interleaved comparisons of 2026-12-02 (MiniLM 59 vs 72 ms, BERT-base
         138 vs 142 ms at seq 128; the fifth 21.8 vs 21.3 ms; docs/quantize-weights.md). Weight codes in [-127, 127], or [-63, 63]
         on x86 CPUs whose U8S8 kernels saturate int16 pairs (no VNNI:
         ``passctl.support.cpu_isa``, ONNX Runtime's ``reduce_range``).
      3. Smoothing (``smooth``, SmoothQuant, Xiao et al. 2023, :mod:`passctl.passes.quantize.smooth`):
         the MatMuls that read a LayerNormalization take ``s_j = max|X_j|^alpha /
         max|W_j|^(1-alpha)`` from the calibration feeds' activations: weights ``diag(s) W``,
         input ``LN(x) / s`` (folded into gamma/beta, or a Mul where the LayerNorm output also
         feeds a residual). ``search`` (default) measures the all-int8 model's output error
         without smoothing and at each alpha of 0.5..0.9 and keeps the lowest; a number fixes
         alpha; ``off`` skips it. Per-column weight scales, per-tensor uint8 activations.
      4. Budget: the all-int8 model's output error on the calibration feeds (under ``metric``,
         measured at the shipped optimization level); while over ``budget``, layers return to
         float32 in order of their model-output error alone (one run per layer up to 64
         layers, else their weight error), the fewest leading ones (amp's ``search_fp32_set``).

    Statistics: ``form``, ``weight_qmax``, ``smoothing`` (alpha, groups, smoothed_layers,
    folded, muls, tried: [[alpha or "off", all-int8 error]]), ``quantized_layers``, ``float_layers``,
    ``bias_absorbed``, ``budget``, ``metric``, ``error``, ``within_budget``, ``search``,
    ``layers`` (name, op, precision, output_error when measured, why).

    Raises:
        UserError: bad options; a GPU target or a non-onnxruntime emitter.
    """

    name = "quantize-dynamic"
    summary = "Dynamic int8 MatMuls (DynamicQuantizeMatMul) under an accuracy budget, cpu"
    budget_label = "quantize-dynamic"

    @dataclass
    class Options:
        """Options of quantize-dynamic.

        Attributes:
            budget: largest model-output error allowed under ``metric`` (calibration feeds).
            metric: ``max-rel``, ``mean-rel`` or ``cosine``.
            form: ``integer`` (MatMulInteger form, default) or ``dqmm``
                (DynamicQuantizeMatMul).
            calib, samples, seed, dims: calibration feeds as for amp / quantize.
            exclude: node names or op types that stay float32 (``;``-separated).
            reduce_range: 7-bit weight codes; None: where the CPU's U8S8 kernels saturate.
            smooth: SmoothQuant migration strength of the LayerNorm-fed MatMuls: ``search``
                (default: the lowest all-int8 error of off, 0.5, 0.6, 0.7, 0.8, 0.9), a
                number in [0, 1], or ``off``.
            target: target profile name (default: the compile context's).
        """

        budget: float = 2e-2
        metric: Literal["max-rel", "mean-rel", "cosine"] = "mean-rel"
        form: Literal["dqmm", "integer"] = "integer"
        calib: str = ""
        samples: int = 2
        seed: int = 0
        dims: str = ""
        exclude: str = ""
        reduce_range: Optional[bool] = None
        smooth: str = "search"
        target: str = "cpu"

        def __post_init__(self) -> None:
            """Raises UserError: an unknown form or smooth, or a bad budget/samples/metric."""
            if self.form not in FORMS:
                raise UserError(f"quantize-dynamic: form={self.form}; use dqmm or integer")
            self.smooth = str(self.smooth).strip().lower()
            if self.smooth not in ("search", "off"):
                try:
                    alpha = float(self.smooth)
                except ValueError:
                    alpha = float("nan")
                if not 0.0 <= alpha <= 1.0:
                    raise UserError(f"quantize-dynamic: smooth={self.smooth}; use search, off or "
                                    "a number in [0, 1] (SmoothQuant's alpha)")
            check_search_options("quantize-dynamic", self.budget, self.samples, self.metric,
                                 "2e-2")

    def run(self, model: Model) -> PassResult:
        o = self.options
        target = get_target(o.target)
        emitter = self._emitter or target.default_emitter
        cpu_onnxruntime_only("quantize-dynamic", target, emitter,
                             "use --target cpu (GPU targets: quantize{calib=...})")
        reduce_range = o.reduce_range
        if reduce_range is None:
            reduce_range = bool(target.isa is not None and target.isa.u8s8_saturates)
        qmax = WEIGHT_QMAX_NO_SATURATION if reduce_range else WEIGHT_QMAX_EXACT
        exclude = parse_exclude(model, o.exclude, self.name)
        layers, why_not = _weight_layers(model, exclude)
        stats: Dict[str, Any] = {"form": o.form, "weight_qmax": qmax, "budget": o.budget,
                                 "metric": o.metric}
        if not layers:
            stats.update(quantized_layers=0, float_layers=len(why_not),
                         layers=[{"name": k, "precision": "fp32", "why": v}
                                 for k, v in why_not.items()])
            return PassResult(False, stats)
        feeds, reference, level = self.reference_run(model, parse_dims(o.dims, self.name))
        start = time.perf_counter()

        def error_on(base: Model, subset: List[WeightLayer]) -> float:
            trial = clone_model(base)
            apply_dynamic(trial, subset, qmax, o.form)
            return output_error(reference, run_model(trial, feeds, optimize=level), o.metric)

        all_low = error_on(model, layers)
        smoothing: Dict[str, Any] = {"alpha": "off"}
        if o.smooth != "off":
            groups = layernorm_groups(model, [wl.layer.position for wl in layers
                                              if wl.w.dtype == np.float32])
            if groups:
                activation_absmax(model, groups, feeds)
                tried: List[List[Any]] = [["off", all_low]] if o.smooth == "search" else []
                for alpha in (ALPHAS if o.smooth == "search" else (float(o.smooth),)):
                    trial = clone_model(model)
                    apply_smoothing(trial, groups, alpha)
                    tried.append([alpha, error_on(trial, _weight_layers(trial, exclude)[0])])
                best = min(tried, key=lambda t: (t[1] if math.isfinite(t[1]) else math.inf))
                smoothing = {"alpha": best[0], "groups": len(groups),
                             "smoothed_layers": sum(len(g.members) for g in groups),
                             "tried": [[a, _round(e)] for a, e in tried]}
                if best[0] != "off":
                    folded, muls = apply_smoothing(model, groups, float(best[0]))
                    smoothing.update(folded=folded, muls=muls)
                    layers, why_not = _weight_layers(model, exclude)
                    all_low = best[1]
        stats["smoothing"] = smoothing

        def error_of(subset: List[WeightLayer]) -> float:
            return error_on(model, subset)

        alone: Dict[int, float] = {}
        rank = {wl.layer.position: _werr(wl.w, qmax) for wl in layers}
        if all_low > o.budget and len(layers) <= OUTPUT_RANKING_MAX:
            alone = {wl.layer.position: error_of([wl]) for wl in layers}
            rank = alone
        ranking = sorted(layers, key=lambda wl: (-rank[wl.layer.position], wl.layer.position))
        result = search_fp32_set(ranking, lambda k: error_of(ranking[k:]), o.budget,
                                 {0: all_low})
        chosen = ranking[result.count:]
        why = {wl.layer.position: f"measured sensitivity (rank {r + 1})"
               for r, wl in enumerate(ranking[:result.count])}
        if result.count == len(ranking):
            logger.warning("quantize-dynamic: %s %g is met only with every MatMul in float32; "
                           "raise the budget or give calib= with real inputs", o.metric,
                           o.budget)
        absorbed = apply_dynamic(model, chosen, qmax, o.form)
        rows: List[Dict[str, Any]] = [{"name": k, "precision": "fp32", "why": v}
                                      for k, v in why_not.items()]
        for wl in sorted(layers, key=lambda wl: wl.layer.position):
            p = wl.layer.position
            row = {"name": wl.layer.name, "op": wl.layer.op,
                   "precision": "fp32" if p in why else "int8"}
            if p in alone:
                row["output_error"] = _round(alone[p])
            if p in why:
                row["why"] = why[p]
            rows.append(row)
        stats.update(quantized_layers=len(chosen), float_layers=len(rows) - len(chosen),
                     bias_absorbed=absorbed, calibration_feeds=len(feeds), measured_with=level,
                     error=_round(result.error),
                     within_budget=result.within_budget and not math.isnan(result.error),
                     search={"seconds": round(time.perf_counter() - start, 3),
                             "sensitivity": "output" if alone else "weight",
                             "runs": len(result.history) + len(alone),
                             "history": [[k, _round(e)] for k, e in result.history]},
                     layers=rows)
        return PassResult(bool(chosen), stats)


def _werr(w: np.ndarray, qmax: int) -> float:
    s = weight_scales(w, 1, qmax)
    deq = quantize_weight(w, s, 1, qmax).astype(np.float32) * s[None, :]
    den = float(np.linalg.norm(w))
    return float(np.linalg.norm(deq - w)) / den if den > 0 else 0.0


def _round(x: float) -> Any:
    return float(f"{x:.4g}") if math.isfinite(x) else str(x)


__all__ = ["QuantizeDynamic", "apply_dynamic"]
