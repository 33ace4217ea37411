"""``passctl bisect``: the first pass of a pipeline, then the first single rewrite inside it, whose
result breaks a numeric bound against the original.

Stage 1 runs the pipeline under :class:`BoundCheck` (``--check-each``'s :class:`CheckEach`, whose
check after each pass runs passctl-only ops through ``lower-standard`` so every stage runs in
ONNX Runtime) and stops at the first pass whose model breaks the bound. Stage 2, for a rule-set
pass (:class:`passctl.passes.rewrite.ruleset.RuleSet`) or a lowering
(:class:`passctl.passes.lowering.table.Lowering`: one node lowered per step), reruns that pass on
the model before it with ``max_rewrites = k`` and finds by bisection the least ``k`` whose result breaks the bound: the
``k``-th rule application is the culprit (the bound held after ``k - 1``). A reproducer folder holds
``before.pir`` (after ``k - 1`` applications), ``after.pir`` (after the ``k``-th), ``rewrite.json``
(rule, root node, provenance, replaced and new nodes) and ``repro.py``, which prints both errors.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from passctl.ir.errors import UserError
from passctl.passes.instruments import CheckEach


class _Broke(Exception):
    def __init__(self, pass_, index: int, before, result, stats):
        super().__init__(pass_.name)
        self.pass_, self.index, self.before, self.result = pass_, index, before, result
        self.stats = stats


def lowered_outputs(model, inputs: Dict[str, Any]) -> Dict[str, Any]:
    """Run a copy of ``model`` (passctl-only ops lowered by ``lower-standard``) in ONNX Runtime."""
    from passctl.ir.onnx_export import to_onnx
    from passctl.passes._snapshot import clone_model
    from passctl.support.check import run_onnxruntime
    from passctl.tools.compare import runnable

    return run_onnxruntime(to_onnx(runnable(clone_model(model))), inputs)


class BoundCheck(CheckEach):
    """:class:`CheckEach` that lowers passctl-only ops before running, keeps the model before
    each pass, and raises at the first pass whose result breaks a bound (stage 1 of bisect)."""

    def before_pass(self, pass_, model, index) -> None:
        from passctl.passes._snapshot import clone_model

        self._before = clone_model(model)

    def evaluate(self, model):
        from passctl.support.check import compare

        return compare(self.reference, lowered_outputs(model, self.inputs))

    def after_pass(self, pass_, model, record) -> None:
        result = self.evaluate(model)
        self.results.append((record.index, pass_.name, result))
        if not self.ok(result):
            raise _Broke(pass_, record.index, self._before, result, record.stats)


def _error(check: BoundCheck, result) -> str:
    metric, bound = check.bounds[0]
    worst = max((d.error(metric) for d in result.outputs.values()), default=0.0)
    max_abs = max((d.max_abs for d in result.outputs.values()), default=0.0)
    verdict = "within" if check.ok(result) else "breaks"
    floor = f" or max-abs {check.atol:g}" if worst > bound and check.ok(result) else ""
    return f"{metric} {worst:.3g}, max-abs {max_abs:.3g} ({verdict} {metric} {bound:g}{floor})"


def _node_text(node) -> Dict[str, Any]:
    return {"name": node.name, "op": node.qualified_op if hasattr(node, "qualified_op") else
            node.op_type, "provenance": list(node.provenance),
            "inputs": [v.name if v is not None else "" for v in node.inputs],
            "outputs": [v.name for v in node.outputs],
            "attributes": {k: repr(a.value) for k, a in node.attributes.items()}}


def bisect(model_path: str, pipeline: str, target: str, metric: str, bound: float,
           inputs: Optional[Dict[str, Any]] = None, seed: int = 0,
           dims: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """Find the first pass, then the first rewrite inside it, that breaks ``metric <= bound``.

    Returns:
        ``{"pass", "index", "error", "rewrite": {...} or None, "before", "after", "k"}`` (the
        models as :class:`passctl.ir.Model`), or ``{"pass": None}`` when every pass keeps the bound.

    Raises:
        UserError: a bad pipeline, target or model; the original does not run on the inputs.
    """
    from passctl.passes import PassManager
    from passctl.passes._snapshot import clone_model
    from passctl.passes.lowering.table import Lowering
    from passctl.passes.rewrite.ruleset import RuleSet
    from passctl.support.inputs import make_inputs
    from passctl.tools.model_source import load_model
    from passctl.tools.opt import pipeline_passes

    passes = pipeline_passes(pipeline, target)
    model, _ = load_model(model_path)
    if inputs is None:
        inputs = make_inputs(model_path, seed=seed, dim_values=dims or {})
    check = BoundCheck(model_path, inputs=inputs, bounds=[(metric, bound)], atol=2.4e-7,
                       write=lambda _: None)
    try:
        PassManager(passes, instruments=[check]).run(model)
    except _Broke as stop:
        broke = stop
        found: Dict[str, Any] = {"pass": broke.pass_.name, "index": broke.index,
                                 "error": _error(check, broke.result), "rewrite": None}
    else:
        return {"pass": None}
    p = broke.pass_
    if p.name == "mixed-precision":
        return _step_precision(found, broke, check)
    if p.name == "quantize-int8":
        return _step_quantize(found, broke, check)
    if not isinstance(p, (RuleSet, Lowering)):
        found["note"] = (f"pass '{p.name}' is not a rule set, a lowering, amp or quantize-int8; "
                         "it is not stepped one rewrite at a time (the model before it is in "
                         "before.pir)")
        found["before"] = broke.before
        return found

    def run_k(k: int):
        m = clone_model(broke.before)
        p.max_rewrites = k
        try:
            p(m)
        finally:
            p.max_rewrites = None
        return m, list(p.applied)

    _, applied = run_k(10 ** 9)
    if not applied:
        found["note"] = (f"pass '{p.name}' changed the model without a recorded rewrite; it is "
                         "not stepped (the model before it is in before.pir)")
        found["before"] = broke.before
        return found
    lo, hi = 0, len(applied)  # the bound holds after lo rewrites and breaks after hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        m, _ = run_k(mid)
        if check.ok(check.evaluate(m)):
            lo = mid
        else:
            hi = mid
    before, _ = run_k(hi - 1)
    after, steps = run_k(hi)
    rule, root, old_nodes, new_nodes = steps[-1]
    from passctl.ir._core import union_provenance

    found.update(k=hi, before=before, after=after,
                 error_before=_error(check, check.evaluate(before)),
                 error_after=_error(check, check.evaluate(after)),
                 rewrite={"rule": rule, "node": root.name or root.op_type,
                          "op": root.op_type, "provenance": list(union_provenance(old_nodes)),
                          "replaced": [_node_text(n) for n in old_nodes],
                          "new": [_node_text(n) for n in new_nodes]})
    return found


def _step_precision(found: Dict[str, Any], broke: _Broke, check: BoundCheck) -> Dict[str, Any]:
    """Stage 2 for ``mixed-precision`` (amp): the nodes it made fp16/bf16 (its ``nodes``
    statistics), applied to the model before it one more at a time in graph order
    (:func:`passctl.passes.precision.casts.apply_precision`, the pass's own writer, with its
    emulation and ``keep_io``); the least prefix that breaks the bound names the layer."""
    from passctl.passes._snapshot import clone_model
    from passctl.passes.precision.casts import apply_precision
    from passctl.passes.precision.cpu_kernels import needs_emulation
    from passctl.passes.precision.rules import LOW_DTYPES

    p, stats = broke.pass_, broke.stats
    low = LOW_DTYPES[stats["dtype"]]
    lowered = {e["name"] for e in stats.get("nodes", ()) if e.get("precision") != "fp32"}

    def key(i: int, n) -> str:
        return n.name or f"{n.op_type}@{i}"

    order = [key(i, n) for i, n in enumerate(broke.before.graph) if key(i, n) in lowered]

    def run_k(k: int):
        m = clone_model(broke.before)
        chosen = set(order[:k])
        nodes = [n for i, n in enumerate(m.graph) if key(i, n) in chosen]
        opset = m.opset
        emulate = (lambda n: needs_emulation(n, opset)) if p._emulated() else None
        if nodes:
            apply_precision(m, nodes, low, emulate, p.options.keep_io)
        return m, nodes

    lo, hi = 0, len(order)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check.ok(check.evaluate(run_k(mid)[0])):
            lo = mid
        else:
            hi = mid
    if not order:
        found["note"] = "mixed-precision changed no node's precision"
        found["before"] = broke.before
        return found
    before, _ = run_k(hi - 1)
    after, _ = run_k(hi)
    node = next(n for i, n in enumerate(broke.before.graph) if key(i, n) == order[hi - 1])
    found.update(k=hi, before=before, after=after,
                 error_before=_error(check, check.evaluate(before)),
                 error_after=_error(check, check.evaluate(after)),
                 rewrite={"rule": f"precision {stats['dtype']}", "node": order[hi - 1],
                          "op": node.op_type, "provenance": list(node.provenance),
                          "replaced": [_node_text(node)], "new": []})
    return found


def _step_quantize(found: Dict[str, Any], broke: _Broke, check: BoundCheck) -> Dict[str, Any]:
    """Stage 2 for ``quantize-int8``: the pass rerun on the model before it with ``max_layers = k``
    (its stepping hook: int8 for the first ``k`` of the layers its search chose, in graph order);
    the least ``k`` that breaks the bound names the layer (the pass's ``layers`` statistics give
    the chosen layers' names)."""
    from passctl.passes._snapshot import clone_model

    p, stats = broke.pass_, broke.stats
    # its ``layers`` rows: skipped nodes first (with a ``why``), then its layers in graph order
    chosen = [e["name"] for e in stats.get("layers", ())
              if e.get("precision") == "int8" and "why" not in e]

    def run_k(k: int):
        m = clone_model(broke.before)
        p.max_layers = k
        try:
            p(m)
        finally:
            p.max_layers = None
        return m

    if not chosen:
        found["note"] = "quantize-int8 made no layer int8"
        found["before"] = broke.before
        return found
    lo, hi = 0, len(chosen)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check.ok(check.evaluate(run_k(mid))):
            lo = mid
        else:
            hi = mid
    before, after = run_k(hi - 1), run_k(hi)
    name = chosen[hi - 1]
    node = next((n for n in broke.before.graph if name in (n.name, *n.provenance)), None)
    found.update(k=hi, before=before, after=after,
                 error_before=_error(check, check.evaluate(before)),
                 error_after=_error(check, check.evaluate(after)),
                 rewrite={"rule": "int8", "node": name,
                          "op": node.op_type if node is not None else "?",
                          "provenance": list(node.provenance) if node is not None else [],
                          "replaced": [_node_text(node)] if node is not None else [],
                          "new": []})
    return found


_REPRO = '''"""Shows the error of one rewrite found by passctl bisect: runs the original, the IR before the
rewrite and the IR after it on the same inputs and prints each one's worst {metric} error.
Run: PYTHONPATH=<folder holding passctl> python repro.py"""
import os
import numpy as np
from passctl.ir.parser import parse_model
from passctl.support.check import compare, run_onnxruntime
from passctl.tools.bisect import lowered_outputs

here = os.path.dirname(os.path.abspath(__file__))
feeds = dict(np.load(os.path.join(here, "inputs.npz")))
reference = run_onnxruntime({original!r}, feeds)
for stem in ("before", "after"):
    path = os.path.join(here, stem + ".pir")
    with open(path, encoding="utf-8") as f:
        model = parse_model(f.read(), path)
    result = compare(reference, lowered_outputs(model, feeds))
    worst = max(d.error({metric!r}) for d in result.outputs.values())
    print(f"{{stem}}: {metric} {{worst:.3g}} (bound {bound!r})")
'''


def write_reproducer(found: Dict[str, Any], folder: str, original: str, inputs: Dict[str, Any],
                     metric: str, bound: float) -> None:
    """The reproducer folder (module docstring)."""
    import numpy as np

    from passctl.ir.printer import print_model

    os.makedirs(folder, exist_ok=True)
    np.savez(os.path.join(folder, "inputs.npz"), **inputs)
    for stem in ("before", "after"):
        if found.get(stem) is not None:
            with open(os.path.join(folder, stem + ".pir"), "w", encoding="utf-8") as f:
                f.write(print_model(found[stem]))
    info = {k: v for k, v in found.items() if k not in ("before", "after")}
    info.update(original=os.path.abspath(original), metric=metric, bound=bound)
    with open(os.path.join(folder, "rewrite.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    if found.get("after") is not None:
        with open(os.path.join(folder, "repro.py"), "w", encoding="utf-8") as f:
            f.write(_REPRO.format(original=os.path.abspath(original), metric=metric, bound=bound))



def main(args, console) -> int:
    from passctl.passes.registry import load_plugin_file
    from passctl.support.inputs import make_inputs
    from passctl.support.dims import parse_dim_args
    from passctl.support.input_files import load_input_file
    from passctl.tools.compare import check_output_folder, parse_bound

    metric, bound = parse_bound(args.bound)
    folder = args.output or os.path.splitext(os.path.basename(args.model))[0] + ".bisect"
    check_output_folder(folder)
    for path in args.load:
        load_plugin_file(path)
    if not os.path.isfile(args.model):
        raise UserError(f"'{args.model}' is not a file; give the original .onnx")
    inputs = load_input_file(args.inputs) or make_inputs(args.model, seed=args.seed,
                                                         dim_values=parse_dim_args(args.dim))
    found = bisect(args.model, args.pipeline, args.target, metric, bound, inputs)

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    if found["pass"] is None:
        say(f"every pass of {args.pipeline} keeps {metric} <= {bound:g}")
        return 0
    say(f"first pass breaking {metric} <= {bound:g}: {found['index']:03d} {found['pass']} "
        f"({found['error']})")
    rw = found.get("rewrite")
    if rw is not None:
        say(f"first rewrite breaking it: #{found['k']} rule '{rw['rule']}' at node '{rw['node']}' "
            f"({rw['op']}), provenance {', '.join(rw['provenance'])}")
        say(f"error before it {found['error_before']}, after it {found['error_after']}")
    elif found.get("note"):
        say(found["note"])
    write_reproducer(found, folder, args.model, inputs, metric, bound)
    say(f"reproducer: {folder}")
    return 0
