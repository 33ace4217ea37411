"""mixed-precision: per-node fp16/bf16 under an accuracy budget, written as a strongly typed graph."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Sequence, Set

from passctl.ir import DataType, Graph, Model, Node
from passctl.ir.errors import UserError
from passctl.passes._snapshot import clone_model
from passctl.passes.base import PassResult
from passctl.passes.common.constants import constant_tensor
from passctl.passes.precision.calibrating import CalibratingPass
from passctl.passes.precision.casts import WeightCache, apply_precision
from passctl.passes.precision.cpu_kernels import needs_emulation
from passctl.passes.precision.ops import convertible, float_inputs, has_float32, is_exact
from passctl.passes.precision.rules import LOW_DTYPES, becomes_inf, finite_max, rule_fp32_nodes
from passctl.passes.precision.sensitivity import (calibration_inputs, check_search_options,
                                                  group_estimates, measure, output_error,
                                                  random_feeds_note, run_model, search_fp32_set)
from passctl.passes.registry import register_pass
from passctl.support.profiles import TargetProfile, get_target

logger = logging.getLogger(__name__)

MEASURED = "measured sensitivity"
FORCED = "forced (force=)"
OVERFLOW = "overflow"
FOLLOWS = "follows its producers"
# Float32 nodes that compute nothing on float data (their float value is an attribute or only its
# shape is read); left out of the per-node report.
_NOT_LISTED = frozenset({"Constant", "Shape", "Size"})


def target_support(target: TargetProfile) -> Dict[str, Any]:
    """What ``target`` allows for ``amp``: the dtypes and whether the graph is emulated.

    GPU profiles: fp16 on every one (Turing and newer have fp16 tensor cores), bf16 from sm_80
    (Ampere) on, as the profile's ``fast_dtypes`` say. The CPU: fp16 and bf16 both, for checking
    only: low-precision nodes compute in float32 between Casts (``emulated``), because ONNX Runtime's
    CPU execution provider has no bf16 kernels for arithmetic and adds its own fp32 Casts around
    most fp16 ones.
    """
    if not target.is_gpu:
        return {"target": target.name, "dtypes": ["fp16", "bf16"], "emulated": True,
                "note": "cpu: low precision is emulated (float32 compute on fp16/bf16 values) for "
                        "checking; the CPU has no fast path"}
    dtypes = [d for d in ("fp16", "bf16") if target.supports(d)
              and (d != "bf16" or target.compute_capability >= (8, 0))]
    return {"target": target.name, "compute_capability": target.sm, "dtypes": dtypes,
            "emulated": False}


def parse_dims(text: str, owner: str = "amp") -> Dict[str, int]:
    """``"batch=1,sequence=64"`` -> ``{"batch": 1, "sequence": 64}``.

    Raises:
        UserError: an entry is not ``name=integer`` with an integer of at least 1 (a size 0 gives
            empty calibration tensors, whose error reads 0); ``owner`` (the pass name) starts the
            message.
    """
    dims: Dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.replace(";", ",").split(","))):
        name, _, value = part.partition("=")
        if not value.strip().isdigit():
            raise UserError(f"{owner}: dims entry '{part}' is not name=integer (e.g. "
                            "dims=sequence=64)")
        if int(value) < 1:
            raise UserError(f"{owner}: dims entry '{part}': a size must be at least 1 (e.g. "
                            f"dims={name.strip()}=1)")
        dims[name.strip()] = int(value)
    return dims


@register_pass
class MixedPrecision(CalibratingPass):
    """Run every node it can in fp16 or bf16, keep float32 where rules or measurements say so.

    Rules:
      1. Nodes that stay float32 by rule (``rules.rule_fp32_nodes``): decomposed LayerNorm/RMSNorm
         statistics, Softmax and its input, Exp, long reductions, mask constants such as float32 min,
         ops without a low-precision form.
      2. Measured (``measure=true``): calibration feeds (``calib`` folder of .npz, or ``samples``
         seeded random feeds) give every float32 value's largest magnitude; a value that would be inf
         in the low type keeps its producer and consumers float32 (``overflow``). The same run gives
         each remaining node's sensitivity: its output error alone in low precision.
      3. Search: when the all-low model misses ``budget``, one run per op type (that type alone low)
         turns the local errors into estimated model-output errors (``group_estimates``); nodes are
         ranked by that estimate (a node's local error is first raised to the input-rounding error of
         the candidates reading it, ``_propagate``); galloping + bisection over the ranking finds the
         fewest leading nodes to keep float32 so that the model outputs meet ``budget`` under
         ``metric`` (``search_fp32_set``). Every search run is the graph this pass writes (real
         fp16/bf16 nodes on GPU targets, emulated ones where the graph is emulated), run in ONNX
         Runtime's CPU provider at the level the numeric check runs the artifact at
         (``shipped_optimization``: session.json's ``ORT_ENABLE_ALL``), and judged by the
         check's metric (NaN/inf mismatches count as an infinite error); where that provider has
         no kernel for the written graph (bf16 arithmetic), the emulated graph is measured
         instead and ``measured_graph`` says so.
      4. Exact ops (Reshape, Transpose, Gather, Concat, Where, Relu, ...) follow their producers:
         low when all their non-constant float inputs are low, so no Cast ping-pong appears around
         them.
      5. Writing (``casts.apply_precision``): each weight converted once and stored in the low type,
         one Cast per (value, type), graph inputs/outputs keep float32 (``keep_io``); on the cpu target
         the low nodes are emulated (``target_support``).

    Statistics: ``dtype``, ``target`` (what it supports), ``low_nodes``, ``fp32_nodes``, ``nodes``
    (one entry per float node: name, op, precision, why, measured max_rel/mean_rel), ``search``
    (runs, error, seconds), ``measured_with`` (the ONNX Runtime optimization level of the search
    runs), ``measured_graph`` (only when the emulated graph stood in for the written one),
    ``measure_seconds`` and the Cast statistics.
    """

    name = "mixed-precision"
    summary = "Assign fp16/bf16 per node under an accuracy budget; insert and simplify Casts"
    budget_label = "amp"

    @dataclass
    class Options:
        """Options of mixed-precision (the ``amp`` alias).

        Attributes:
            dtype: the low precision, ``fp16`` or ``bf16``.
            budget: largest model-output error allowed under ``metric``.
            metric: ``max-rel`` (max |r-c| / max |r|), ``mean-rel`` (sum |r-c| / sum |r|) or
                ``cosine`` (1 - cosine similarity), worst over outputs and calibration feeds.
            calib: folder of ``.npz`` calibration feeds (arrays by graph input name); empty: random.
            samples: number of seeded random feeds when ``calib`` is empty.
            seed: seed of the first random feed.
            dims: sizes of symbolic input dimensions for random feeds, e.g. ``batch=1;sequence=64``.
            measure: measure ranges and sensitivity and search (false: rules only).
            long_reduction: reduced element count from which a sum stays float32.
            keep_io: keep float32 graph inputs and outputs float32.
            target: target profile name (default: the compile context's, the CLI's ``--target``).
            emulate: compute low nodes in float32 behind Casts (default: on the cpu target only).
            force: node names (``;``-separated) made ``dtype`` whatever the rules and the search
                say, to reproduce or debug a precision problem (``passctl bisect`` then names
                the forced node whose change breaks a bound); the search neither measures nor
                counts them.
        """

        dtype: Literal["fp16", "bf16"] = "fp16"
        budget: float = 1e-2
        metric: Literal["max-rel", "mean-rel", "cosine"] = "mean-rel"
        calib: str = ""
        samples: int = 2
        seed: int = 0
        dims: str = ""
        measure: bool = True
        long_reduction: int = 4096
        keep_io: bool = True
        target: str = "cpu"
        emulate: Optional[bool] = None
        force: str = ""

        def __post_init__(self) -> None:
            """Raises UserError: a bad ``budget``, ``samples`` or ``metric``
            (:func:`passctl.passes.precision.sensitivity.check_search_options`)."""
            check_search_options("amp", self.budget, self.samples, self.metric, "1e-2")

    def run(self, model: Model) -> PassResult:
        o = self.options
        target = get_target(o.target)
        support = target_support(target)
        if o.dtype not in support["dtypes"]:
            need = "sm_80 or newer (A100, A10, L4, H100, H200)" if o.dtype == "bf16" else "fp16 units"
            other = f"use dtype={support['dtypes'][0]}" if support["dtypes"] else "use another target"
            raise UserError(f"amp: dtype={o.dtype} is not supported on target {target.name} "
                            f"({target.description}, {target.sm}): {o.dtype} needs {need}; {other}")
        low = LOW_DTYPES[o.dtype]
        graph = model.graph
        nodes = list(graph)
        pos = {n: i for i, n in enumerate(nodes)}
        why: Dict[int, str] = {pos[n]: r for n, r in rule_fp32_nodes(graph, low, o.long_reduction,
                                                                         model.opset).items()}
        forced = _forced_nodes(nodes, o.force, o.dtype)
        for i in forced:  # out of the search; made low after it, overriding any rule
            why[i] = FORCED
        compute = [i for i, n in enumerate(nodes)
                   if has_float32(n) and convertible(n) and not is_exact(n) and i not in why]
        stats: Dict[str, Any] = {"dtype": o.dtype, "target": support, "budget": o.budget,
                                 "metric": o.metric}
        score: Dict[int, Dict[str, float]] = {}
        low_compute: Set[int] = set(compute)
        if o.measure and compute:
            low_compute = self._measure_and_search(model, compute, low, why, score, stats)
        for i in forced:
            why.pop(i, None)
        low_compute = set(low_compute) | forced
        low_set = _follow(graph, nodes, low_compute, why)
        emulate = self._emulated()
        opset = model.opset
        cast_stats = apply_precision(model, [nodes[i] for i in sorted(low_set)], low,
                                     (lambda n: needs_emulation(n, opset)) if emulate else None,
                                     o.keep_io)
        report = []
        for i, n in enumerate(nodes):
            if (not has_float32(n) or n.op_type in _NOT_LISTED) and i not in low_set:
                continue
            entry = {"name": n.name or f"{n.op_type}@{i}", "op": n.op_type,
                     "precision": o.dtype if i in low_set else "fp32"}
            if i not in low_set:
                entry["why"] = why.get(i, FOLLOWS)
            if i in forced:
                entry["forced"] = True
            entry.update(score.get(i, {}))
            report.append(entry)
        stats.update(low_nodes=len(low_set), fp32_nodes=len(report) - len(low_set), nodes=report,
                     emulated=bool(emulate), **cast_stats)
        logger.info("amp: %d nodes in %s, %d float32", len(low_set), o.dtype, stats["fp32_nodes"])
        return PassResult(bool(low_set), stats)

    def _emulated(self) -> bool:
        """Whether the written graph computes its low nodes in float32 behind Casts: the
        ``emulate`` option, else the target's default (:func:`target_support`)."""
        o = self.options
        return o.emulate if o.emulate is not None else target_support(get_target(o.target))["emulated"]

    def _measure_and_search(self, model: Model, compute: List[int], low: DataType, why: Dict[int, str],
                            score: Dict[int, Dict[str, float]], stats: Dict[str, Any]) -> Set[int]:
        o = self.options
        nodes = list(model.graph)
        feeds = calibration_inputs(model, o.calib, o.samples, o.seed, parse_dims(o.dims))
        try:  # the float32 outputs come from the measuring session (m.reference)
            m = measure(model, compute, low, feeds)
        except Exception as e:  # the user's model or feeds: measure only adds probes
            raise UserError(f"amp: ONNX Runtime cannot run the float32 model on the calibration feeds "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); fix the feeds "
                            "(calib=, dims=) or use measure=false for rules only") from e
        reference = m.reference
        stats["measure_seconds"] = round(m.seconds, 3)
        stats["calibration_feeds"] = len(feeds)
        limit = finite_max(low)
        for i, n in enumerate(nodes):
            values = [v for v in (*n.inputs, *n.outputs) if v is not None]
            big = max((m.absmax.get(v.name, 0.0) for v in values), default=0.0)
            if becomes_inf(big, low) and i not in why and has_float32(n):
                why[i] = f"{OVERFLOW} (|x| up to {big:.3g} > {limit:.6g})"
        for i in compute:
            score[i] = {"max_rel": _round(m.max_rel.get(i)), "mean_rel": _round(m.mean_rel.get(i)),
                        "input_rel": _round((m.input_max_rel if o.metric == "max-rel"
                                             else m.input_mean_rel).get(i))}
        candidates = [i for i in compute if i not in why]
        own = m.max_rel if o.metric == "max-rel" else m.mean_rel
        suffer = m.input_max_rel if o.metric == "max-rel" else m.input_mean_rel
        key = _propagate(nodes, set(candidates), own, suffer)
        cache: WeightCache = {}
        # Each trial is the graph this pass would write (the same emulation choice),
        # run at the optimization level the check runs the artifact at: a real fp16 graph is
        # measured in ONNX Runtime's fp16 kernels, as --check runs it (case 06 of issue 15: the
        # emulated graph read 0.0077 where the shipped fp16 graph gave 0.0129 on feed 1).
        level = self.shipped_optimization()
        emulated = [self._emulated()]
        stats["measured_with"] = level

        def evaluate_low(low_compute: Sequence[int]) -> float:
            trial = clone_model(model)
            trial_nodes = list(trial.graph)
            low_idx = _follow(trial.graph, trial_nodes, set(low_compute), why)
            opset = trial.opset
            emulate = (lambda n: needs_emulation(n, opset)) if emulated[0] else None
            apply_precision(trial, [trial_nodes[i] for i in low_idx], low, emulate, True, cache)
            try:
                return output_error(reference, run_model(trial, feeds, optimize=level), o.metric)
            except Exception as e:  # noqa: BLE001  (ORT's NotImplemented and siblings)
                if emulated[0] or "NOT_IMPLEMENTED" not in str(e):
                    raise
                # ONNX Runtime's CPU provider lacks a low-precision kernel of the written graph, so
                # --check cannot run it either: measure the emulated graph, and say so.
                emulated[0] = True
                stats["measured_graph"] = ("emulated (ONNX Runtime's CPU provider has no kernel "
                                           f"for the written graph: {str(e).splitlines()[0][:200]})")
                logger.warning("amp: %s", stats["measured_graph"])
                return evaluate_low(low_compute)

        start = time.perf_counter()
        all_low = evaluate_low(candidates)
        groups: Dict[str, List[int]] = {}
        for i in candidates:
            groups.setdefault(nodes[i].op_type, []).append(i)
        group_errors: Dict[str, float] = {}
        if all_low > o.budget and len(groups) > 1:
            key, group_errors = group_estimates(groups, key, evaluate_low, o.metric)
            for i in candidates:
                score[i]["estimated_output_error"] = _round(key[i])
        ranking = sorted(candidates, key=lambda i: (-key.get(i, 0.0), i))

        def evaluate(k: int) -> float:
            return evaluate_low(ranking[k:])

        result = search_fp32_set(ranking, evaluate, o.budget, {0: all_low})
        for rank, i in enumerate(ranking[:result.count]):
            why[i] = f"{MEASURED} (rank {rank + 1})"
        stats["search"] = {"seconds": round(time.perf_counter() - start, 3),
                           "runs": len(result.history) + len(group_errors),
                           "group_errors": {g: _round(e) for g, e in group_errors.items()},
                           "history": [[k, _round(e)] for k, e in result.history],
                           "fp32_by_search": result.count, "error": _round(result.error),
                           "within_budget": result.within_budget}
        if result.count == len(ranking) and ranking:
            note = random_feeds_note(model, o.calib, parse_dims(o.dims))
            logger.warning("amp: %s %g is met only with every measured node in float32 (nothing left "
                           "in %s); %s; or raise the budget", o.metric, o.budget, o.dtype,
                           note or "check that the calibration feeds (calib=) are representative")
        return set(ranking[result.count:])


def _forced_nodes(nodes: List[Node], text: str, dtype: str) -> Set[int]:
    """Indices (in ``nodes``, graph order) of the nodes named by the ``force`` option: a node's
    name, else the report's ``OP@INDEX`` key of an unnamed node.

    Raises:
        UserError: a name no node has, or a node with no low-precision form (no float32 value,
            an op amp cannot retype: Cast, a custom domain, values already in another type).
    """
    names = [t.strip() for t in text.split(";") if t.strip()]
    if not names:
        return set()
    index = {}
    for i, n in enumerate(nodes):
        index.setdefault(n.name or f"{n.op_type}@{i}", i)
    out: Set[int] = set()
    for name in names:
        i = index.get(name)
        if i is None:
            raise UserError(f"mixed-precision (amp): force= names node '{name}', which is not in "
                            "the graph (give node names as the IR text or the report's nodes "
                            "list spells them, separated by ';')")
        n = nodes[i]
        if not (has_float32(n) and convertible(n)):
            raise UserError(f"mixed-precision (amp): force= node '{name}' ({n.op_type}) has no "
                            f"{dtype} form (no float32 value it can retype); force another node")
        out.add(i)
    return out


def _propagate(nodes: List[Node], candidates: Set[int], own: Dict[int, float],
               suffer: Dict[int, float]) -> Dict[int, float]:
    """Ranking score: a node's own error, raised to the input-rounding error of any candidate that
    reads its output (through exact ops), since keeping that consumer float32 does not help while
    this producer rounds its output (``Sub(Add(x, 1000), 1000)``: the Add must stay float32 too)."""
    pos = {n: i for i, n in enumerate(nodes)}
    key = {i: own.get(i, 0.0) for i in candidates}
    for c in candidates:
        hurt = suffer.get(c, 0.0)
        stack = [v for v in nodes[c].inputs if v is not None]
        seen = set()
        while stack:
            v = stack.pop()
            producer = v.producer
            if producer is None or producer in seen or producer not in pos:
                continue
            seen.add(producer)
            i = pos[producer]
            if i in candidates:
                key[i] = max(key[i], hurt)
            elif is_exact(producer):
                stack.extend(u for u in producer.inputs if u is not None)
    return key


def _round(x: Optional[float]) -> Any:
    """4 significant digits for the report; inf and NaN as strings (report.json is strict JSON)."""
    if x is None:
        return None
    return float(f"{x:.4g}") if math.isfinite(x) else str(x)


def _follow(graph: Graph, nodes: List[Node], low_compute: Set[int], why: Dict[int, str]) -> Set[int]:
    """Add the exact ops whose non-constant float32 inputs are all produced by low nodes, and those
    reading only constants (Gather of an embedding table) whose readers are all low compute nodes."""
    low = set(low_compute)
    low_nodes = {nodes[i] for i in low}
    index = {n: k for k, n in enumerate(nodes)}
    for i, n in enumerate(nodes):
        if i in low or i in why or not is_exact(n) or not convertible(n):
            continue
        feeds = [n.inputs[k] for k in float_inputs(n)]
        live = [v for v in feeds if constant_tensor(v) is None]
        if live and all(v.producer in low_nodes for v in live):
            low.add(i)
            low_nodes.add(n)
        elif feeds and not live:  # reads constants only (an embedding table): low when its readers are
            readers = [c for o in n.outputs for c in o.consumers()]
            if readers and all(index.get(c) in low_compute for c in readers):
                low.add(i)
                low_nodes.add(n)
    return low
