"""quantize-int8: static post-training int8 quantization (QDQ) under an accuracy budget."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple

from passctl.ir import Model
from passctl.ir.errors import UserError
from passctl.passes._snapshot import clone_model
from passctl.passes.base import OutputForm, PassResult
from passctl.passes.precision.amp import parse_dims
from passctl.passes.precision.calibrating import CalibratingPass
from passctl.passes.precision.sensitivity import (calibration_inputs, check_search_options,
                                                  output_error, random_feeds_note, run_model,
                                                  search_fp32_set)
from passctl.passes.quantize.calibrate import Sensitivity, calibrate, sensitivity
from passctl.passes.quantize.layers import (QUANTIZABLE, QuantLayer, Skipped, find_layers,
                                            quantizable_nodes)
from passctl.passes.quantize.opset import adopt, raise_opset
from passctl.passes.quantize.qdq import QDQ_MIN_OPSET, WeightCache, apply_qdq
from passctl.passes.quantize.unfuse import unfuse_conv
from passctl.passes.registry import register_pass
from passctl.support.cpu_isa import WEIGHT_QMAX_EXACT, WEIGHT_QMAX_NO_SATURATION
from passctl.support.profiles import get_target

logger = logging.getLogger(__name__)

CALIBRATIONS = ("minmax", "percentile")
OUTPUT_RANKING_MAX = 64
"""``sensitivity=auto`` ranks by per-layer model-output error (one model run per layer) up to this
many candidate layers, by the one-session local error above."""
MEASURED = "measured sensitivity"


@register_pass
class QuantizeInt8(CalibratingPass):
    """Quantize Conv, MatMul (constant B) and Gemm to int8 in QDQ form, keeping float32 where the
    accuracy budget needs it.

    Rules:
      1. Layers (``layers.find_layers``): Conv (and ONNX Runtime's FusedConv), MatMul with a
         constant 2-D B, Gemm, with a float32 data input; nodes or op types named in ``exclude``
         stay float32. Opsets below 13 are raised to 13 first (``opset.raise_opset``: per-channel
         DequantizeLinear needs ``axis``).
      2. Weights: symmetric per output channel (Conv axis 0, MatMul B ``[K, N]`` axis 1, Gemm
         transB=1 axis 0), scale ``max |w| / qmax``, zero point 0, stored as an int8 initializer
         read through DequantizeLinear (``scales.weight_scales``). ``qmax`` is 127, except for a
         CPU target whose ONNX Runtime U8S8 kernels add pairs of products in saturating int16
         (x86 without VNNI: ``passctl.support.cpu_isa``): there codes stay in [-63, 63]
         (ONNX Runtime's ``reduce_range``), so the shipped kernels compute the QDQ graph's math
         exactly, at U8S8 speed. ``reduce_range`` overrides the choice. Biases stay float32.
      3. Activations: each layer's data input gets QuantizeLinear -> DequantizeLinear, per tensor,
         symmetric (zero point 0, as TensorRT requires), scale from the calibration feeds
         (``calibration=minmax``: max |x| / 127; ``percentile``: the ``percentile``-th percentile
         of |x| / 127), measured in one ONNX Runtime session with the inputs exposed as outputs
         (``calibrate.calibrate``).
      4. Target form: GPU targets get TensorRT's explicit-quantization form (int8, zero point 0,
         Q/DQ on layer inputs only). The cpu target gets ONNX Runtime's form: activations as uint8
         with zero point 128 (the same symmetric grid; its x86 U8S8 kernels) and each quantized
         layer's output quantized too, so ``DQ -> Conv/MatMul/Gemm -> Q`` node units become
         QLinearConv / QLinearMatMul / QGemm; FusedConv (no int8 kernel) is split back into Conv +
         activation first (``unfuse.unfuse_conv``). ``activations`` and ``outputs`` override this.
      5. Budget: the all-int8 model's output error on the calibration feeds (amp's
         ``output_error`` under ``metric``: the numeric check's metric, NaN/inf mismatches
         included) against the float32 model run as written (``ORT_DISABLE_ALL``). The int8 graph
         is measured as the check runs the artifact (``shipped_optimization``): an ONNX Runtime
         artifact at its ``session.json`` level ``ORT_ENABLE_ALL``, on GPU targets too, whose
         QLinearConv / QLinearMatMul / QGemm kernels requantize in fixed point (a PP-OCRv4 det
         chosen at mean-rel 0.0275 unfused gave 0.044 as shipped on 128x128 text images; case 05
         of issue 15: a10's int8 MatMul 0.0081 unfused, 0.040 as shipped); a TensorRT artifact
         unoptimized (TensorRT parses the graph as written). If the error is
         over ``budget``, layers are ranked by sensitivity: ``output`` (``auto`` up to 64
         layers) is the model-output error with only that layer in int8, one model run per
         layer; ``local`` is each layer's own int8 error measured in one session (``calibrate.sensitivity``; max-rel for ``metric=max-rel``, else
         mean-rel). The most sensitive layers go back to float32 in ranking order: the fewest
         leading layers that meet the budget, found by galloping + bisection over whole-model runs
         (amp's ``search_fp32_set``; the same result as removing them one at a time when the error
         falls as layers return to float, in about 2 log2(k) + 2 runs instead of k). PP-OCRv4 det
         after cleanup,fuse (640x640): 49 of 62 layers int8 at mean-rel 0.016 with ``output`` in
         35 s, 15 of 62 with ``local`` in 9 s.

    Statistics: ``target`` (with the CPU's ``isa`` and how its int8 kernels accumulate),
    ``weight_bits`` (8, or 7 with ``reduce_range``), ``activations``, ``outputs_quantized``, ``fusedconv_split``,
    ``calibration``, ``percentile``, ``calibration_feeds``, ``budget``, ``metric``, ``error``
    (measured on the calibration feeds for the written graph), ``measured_with`` (the ONNX Runtime
    graph optimization level of that measurement), ``within_budget``,
    ``quantized_layers``, ``float_layers``, ``layers`` (name, op, precision, why, max_rel,
    mean_rel, output_error), ``search``, ``opset_raised``, ``qdq_nodes``, ``weight_bytes_saved``.
    """

    name = "quantize-int8"
    #: ``passctl bisect``'s stepping hook: int8 for only the first ``max_layers`` (graph order)
    #: of the layers the search chose (None: all of them).
    max_layers: Optional[int] = None
    summary = "Static int8 post-training quantization (QDQ, symmetric) under an accuracy budget"
    budget_label = "quantize"

    @dataclass
    class Options:
        """Options of quantize-int8 (the ``quantize`` alias).

        Attributes:
            calibration: ``minmax`` or ``percentile`` (activation ranges).
            percentile: percentile of |x| for ``calibration=percentile``, in (0, 100].
            budget: largest model-output error allowed under ``metric`` (calibration feeds).
            metric: ``max-rel``, ``mean-rel`` or ``cosine`` (as amp, worst over outputs and feeds).
            calib: folder of ``.npz`` calibration feeds (arrays by graph input name); empty: random.
            samples: number of seeded random feeds when ``calib`` is empty.
            seed: seed of the first random feed.
            dims: sizes of symbolic input dimensions for random feeds, e.g. ``x[2]=64;x[3]=64``.
            exclude: node names or op types that stay float32, separated by ``;`` or by commas in
                quotes (``exclude='conv1,Gemm'``).
            sensitivity: how layers are ranked when the all-int8 model misses the budget:
                ``local`` (each layer's own output error, one session), ``output`` (the
                model-output error with only that layer int8: one model run per layer) or ``auto``
                (``output`` up to :data:`OUTPUT_RANKING_MAX` layers, else ``local``).
            activations: activation codes: ``int8`` (zero point 0, TensorRT), ``uint8`` (zero
                point 128: the same symmetric grid, ONNX Runtime's x86 U8S8 kernels) or ``auto``
                (uint8 on the cpu target, int8 on GPU targets).
            outputs: also quantize each quantized layer's output (ONNX Runtime's QDQ node units
                ``DQ -> Conv -> Q``); None: on the cpu target only.
            reduce_range: 7-bit weight codes ([-63, 63]) so that no pair of u8 x s8 products
                saturates int16 (ONNX Runtime's option of that name); None: where the target's
                int8 kernels saturate (CPU targets without VNNI), else 8 bits.
            target: target profile name (default: the compile context's, the CLI's ``--target``).
        """

        calibration: Literal["minmax", "percentile"] = "minmax"
        percentile: float = 99.99
        budget: float = 2e-2
        metric: Literal["max-rel", "mean-rel", "cosine"] = "mean-rel"
        calib: str = ""
        samples: int = 2
        seed: int = 0
        dims: str = ""
        exclude: str = ""
        sensitivity: Literal["auto", "local", "output"] = "auto"
        activations: Literal["auto", "int8", "uint8"] = "auto"
        outputs: Optional[bool] = None
        reduce_range: Optional[bool] = None
        target: str = "cpu"

        def __post_init__(self) -> None:
            """Raises UserError: an unknown ``calibration``, ``percentile`` outside (0, 100] or
            given without ``calibration=percentile``, or a bad ``budget``, ``samples`` or
            ``metric`` (:func:`passctl.passes.precision.sensitivity.check_search_options`)."""
            if self.calibration not in CALIBRATIONS:
                raise UserError(f"quantize-int8: calibration={self.calibration} is unknown; use "
                                f"{', '.join(CALIBRATIONS)}")
            if not 0 < self.percentile <= 100:
                raise UserError(f"quantize-int8: percentile={self.percentile:g} is outside "
                                "(0, 100]; use e.g. percentile=99.99")
            default = type(self).__dataclass_fields__["percentile"].default
            if self.percentile != default and self.calibration != "percentile":
                raise UserError(f"quantize-int8: percentile={self.percentile:g} applies only to "
                                f"calibration=percentile (calibration={self.calibration}); add "
                                "calibration=percentile or drop percentile=")
            check_search_options("quantize-int8", self.budget, self.samples, self.metric, "2e-2")

    def output_forms(self) -> List[OutputForm]:
        """ONNX Runtime's uint8 form (zero point 128) when ``activations=uint8``, or ``auto`` on
        the cpu target; emitters that need zero points of 0 (TensorRT) refuse it."""
        o = self.options
        cpu = not get_target(o.target).is_gpu
        if o.activations == "uint8" or (o.activations == "auto" and cpu):
            why = "activations=uint8" if o.activations == "uint8" else f"target={o.target}"
            return [OutputForm("uint8-qdq", why, "uint8 activations with zero point 128",
                               f"drop {why} (GPU targets get int8 with zero point 0)")]
        return []

    def _exclude(self, model: Model) -> List[str]:
        """The ``exclude`` entries; each must name a quantizable node (its name or a source node
        name in its provenance, e.g. ``Conv@1`` after ``cleanup,fuse``) or a quantizable op type
        present in the model.

        Raises:
            UserError: an entry matches no such node; the message lists the candidates.
        """
        text = self.options.exclude.replace(";", ",")
        entries = [e.strip() for e in text.split(",") if e.strip()]
        candidates = quantizable_nodes(model.graph)
        known = set()
        for name, n in candidates:
            known.update((name, n.name, n.op_type, *n.provenance))
        for e in entries:
            if e not in known:
                ops = sorted({n.op_type for _, n in candidates})
                names = [name for name, _ in candidates]
                shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)"
                                                 if len(names) > 12 else "")
                raise UserError(f"quantize-int8: exclude entry '{e}' names no quantizable node "
                                f"({', '.join(QUANTIZABLE)}) of the model; give one of the op "
                                f"types {', '.join(ops) or 'none'} or node names {shown or 'none'}")
        return entries

    def run(self, model: Model) -> PassResult:
        o = self.options
        target = get_target(o.target)
        if not target.supports("int8") and target.is_gpu:
            raise UserError(f"quantize-int8: target {target.name} ({target.description}) has no "
                            "int8 tensor cores; use a Turing or newer GPU target or cpu")
        exclude = self._exclude(model)
        unsigned = o.activations == "uint8" or (o.activations == "auto" and not target.is_gpu)
        outputs = o.outputs if o.outputs is not None else not target.is_gpu
        int8 = f"tensor cores ({target.sm})" if target.is_gpu else "cpu kernels"
        about: Dict[str, Any] = {"target": target.name, "int8": int8}
        reduce_range = o.reduce_range
        if target.isa is not None:
            about.update(isa=target.isa.name, int8_kernels=target.isa.int8_kernels)
            if reduce_range is None:
                reduce_range = target.isa.u8s8_saturates
        qmax = WEIGHT_QMAX_NO_SATURATION if reduce_range else WEIGHT_QMAX_EXACT
        stats: Dict[str, Any] = {
            "target": about, "weight_bits": 7 if reduce_range else 8,
            "calibration": o.calibration,
            "budget": o.budget, "metric": o.metric,
            "activations": "uint8 (zero point 128)" if unsigned else "int8 (zero point 0)",
            "outputs_quantized": outputs}
        if o.calibration == "percentile":
            stats["percentile"] = o.percentile
        original = clone_model(model)  # restored when no layer ends up int8 (tensors shared)
        layers, skipped = find_layers(model.graph, exclude)
        nodes = list(model.graph)
        split = [nodes[l.position] for l in layers if l.op == "FusedConv"]
        if split:  # ONNX Runtime has no int8 FusedConv: Conv + activation again
            stats["fusedconv_split"] = sum(unfuse_conv(model.graph, n) for n in split)
            layers, skipped = find_layers(model.graph, exclude)
        if not layers:
            stats.pop("fusedconv_split", None)
            adopt(model, original)
            stats.update(quantized_layers=0, error=0.0, **_skipped_stats(skipped))
            _warn_nothing_to_quantize(skipped)
            return PassResult(False, stats)
        old_opset = raise_opset(model, QDQ_MIN_OPSET)
        if old_opset != model.opset:
            stats["opset_raised"] = [old_opset, model.opset]
            layers, skipped = find_layers(model.graph, exclude)
        feeds = self._feeds(model)
        stats["calibration_feeds"] = len(feeds)
        try:
            scales, reference = calibrate(model, layers, feeds, o.calibration, o.percentile,
                                          outputs, unsigned)
        except Exception as e:  # the user's model or feeds, before passctl changed anything
            first = str(e).splitlines()[0][:300] if str(e) else ""
            raise UserError(f"quantize-int8: ONNX Runtime cannot run the float32 model on the "
                            f"calibration feeds ({type(e).__name__}: {first}); fix the feeds "
                            "(calib=, dims=)") from e
        cache = WeightCache(qmax)
        level = self.shipped_optimization()  # measured as the check runs the artifact (rule 5)
        stats["measured_with"] = level

        def error_of(int8_layers: List[QuantLayer]) -> float:
            trial = clone_model(model)
            apply_qdq(trial, int8_layers, scales, cache, unsigned, outputs)
            return output_error(reference, run_model(trial, feeds, optimize=level), o.metric)

        sens = sensitivity(model, layers, scales, feeds, cache, unsigned, outputs)
        quantized, alone, why = self._search(model, layers, sens, error_of, stats, skipped)
        if self.max_layers is not None:  # passctl bisect: the first k chosen layers only
            quantized = sorted(quantized, key=lambda l: l.position)[:self.max_layers]
            kept = {l.position for l in quantized}
            why.update({l.position: "bisect limit" for l in layers
                        if l.position not in kept and l.position not in why})
        if not quantized:  # every layer float32: the graph as it came (no opset raise, no split)
            stats.pop("fusedconv_split", None)
            stats.pop("opset_raised", None)
            adopt(model, original)
        added = apply_qdq(model, quantized, scales, cache, unsigned, outputs)
        entries: List[Dict[str, Any]] = []
        for l in sorted(layers, key=lambda l: l.position):
            entry = {"name": l.name, "op": l.op,
                     "precision": "fp32" if l.position in why else "int8",
                     "max_rel": _round(sens.max_rel[l.position]),
                     "mean_rel": _round(sens.mean_rel[l.position])}
            if l.position in alone:
                entry["output_error"] = _round(alone[l.position])
            if l.position in why:
                entry["why"] = why[l.position]
            entries.append(entry)
        saved = sum(l.weight.nbytes - l.weight.size for l in quantized)
        stats.update(quantized_layers=len(quantized), qdq_nodes=added,
                     weight_bytes_saved=int(saved), **_skipped_stats(skipped, entries))
        logger.info("quantize-int8: %d layers int8, %d float, %s %s", len(quantized),
                    stats["float_layers"], o.metric, stats["error"])
        return PassResult(bool(quantized), stats)

    def _search(self, model: Model, layers: List[QuantLayer], sens: Sensitivity,
                error_of: Callable[[List[QuantLayer]], float], stats: Dict[str, Any],
                skipped: Optional[Dict[str, Skipped]] = None
                ) -> Tuple[List[QuantLayer], Dict[int, float], Dict[int, str]]:
        """Rank the layers and find the fewest most sensitive ones to keep float32 (rule 5).

        Warns when the budget is met only with every layer float32, naming the random feeds' sizes
        (:func:`passctl.passes.precision.sensitivity.random_feeds_note`) when ``calib`` is empty.

        Returns:
            ``(layers to quantize, {position: output error alone} (empty for local ranking),
            {position of a float32 layer: why})``; fills ``stats`` (``error``, ``within_budget``,
            ``search``).
        """
        o = self.options
        start = time.perf_counter()
        own: Dict[int, float] = dict(sens.max_rel if o.metric == "max-rel" else sens.mean_rel)
        all_int8 = error_of(layers)
        alone: Dict[int, float] = {}
        per_layer = o.sensitivity == "output" or (o.sensitivity == "auto"
                                                  and len(layers) <= OUTPUT_RANKING_MAX)
        if all_int8 > o.budget and per_layer:  # one run per layer
            alone = {l.position: error_of([l]) for l in layers}
            own = alone
        ranking = sorted(layers, key=lambda l: (-own[l.position], l.position))
        result = search_fp32_set(ranking, lambda k: error_of(ranking[k:]), o.budget,
                                 {0: all_int8})
        # a NaN error (e.g. NaN outputs) never meets the budget
        stats.update(error=_round(result.error),
                     within_budget=result.within_budget and not math.isnan(result.error))
        stats["search"] = {"seconds": round(time.perf_counter() - start, 3),
                           "sensitivity": "output" if alone else "local",
                           "measure_seconds": round(sens.seconds, 3),
                           "runs": len(result.history) + len(alone),
                           "history": [[k, _round(e)] for k, e in result.history]}
        if result.count == len(ranking):
            note = random_feeds_note(model, o.calib, parse_dims(o.dims, self.name))
            others = list((skipped or {}).values())
            already = sum(s.precision == "int8" for s in others)
            done = f"; {already} other layers were already quantized" if already else ""
            logger.warning("quantize-int8: %s %g is met only with every layer in float32 (0 of %d "
                           "layers int8%s); %s; or raise the budget", o.metric, o.budget,
                           len(ranking) + len(others) - already, done,
                           note or "check that the calibration feeds (calib=) are representative")
        why = {l.position: f"{MEASURED} (rank {r + 1})"
               for r, l in enumerate(ranking[:result.count])}
        return ranking[result.count:], alone, why

    def _feeds(self, model: Model):
        o = self.options
        return calibration_inputs(model, o.calib, o.samples, o.seed,
                                  parse_dims(o.dims, self.name), owner=self.name)


def _skipped_stats(skipped: Dict[str, Skipped], entries: Optional[List[Dict[str, Any]]] = None
                   ) -> Dict[str, Any]:
    """``layers`` (the skipped nodes' rows, then ``entries``), ``float_layers`` (rows not int8)
    and ``already_int8`` (layers quantized before this pass) for the statistics."""
    rows = [{"name": k, "op": v.op, "precision": v.precision, "why": v.why}
            for k, v in skipped.items()] + list(entries or [])
    return {"layers": rows, "float_layers": sum(r["precision"] != "int8" for r in rows),
            "already_int8": sum(v.precision == "int8" for v in skipped.values())}


def _warn_nothing_to_quantize(skipped: Dict[str, Skipped]) -> None:
    """Warn when no layer is float32 because the model is already low precision or int8."""
    low = sorted({v.precision for v in skipped.values() if v.precision in ("fp16", "bf16")})
    if low:
        kind = "float16" if low == ["fp16"] else " / ".join(low)
        logger.warning("quantize-int8: no float32 layer to quantize (the model computes in %s, "
                       "e.g. after amp); put quantize before amp", kind)
    elif skipped and all(v.precision == "int8" for v in skipped.values()):
        logger.warning("quantize-int8: all %d layers are already quantized (int8 weights through "
                       "DequantizeLinear); nothing to do", len(skipped))
    else:
        logger.info("quantize-int8: no layer to quantize")


def _round(x: float) -> Any:
    """4 significant digits for the report; inf and NaN as strings (report.json is strict JSON)."""
    return float(f"{x:.4g}") if math.isfinite(x) else str(x)
