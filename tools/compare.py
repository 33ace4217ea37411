"""``passctl compare``: run an original model and a compiled candidate on the same inputs with every
intermediate tensor exposed, pair tensors through node provenance and report per-pair errors.

Pairing (:func:`pair_tensors`). Every candidate node carries ``provenance``: the names of the
original nodes it came from (``Graph.replace_nodes`` gives a fused node the union of the nodes it
replaced). An original tensor ``T`` (an output of original node ``o``) may pair only with an output
``c`` of a candidate node whose provenance contains ``o``, of the same runtime shape and of the same
dtype class (float with float, any precision, so fp16/bf16 amp and int8 QDQ graphs compare; else
the same dtype). A graph output pairs with the candidate's graph output of its name (the
interface, whoever computes it now). Among the candidates, one with ``T``'s own name wins; else ``c`` and ``T``
must agree on whether they leave their fusion group (a consumer outside the candidate node's
provenance, or a graph output). A tensor that leaves its group pairs with a candidate tensor that
leaves it towards a consumer of the same provenance (the last one, after amp's Cast back, say), or
with the group's lone leaving tensor of that shape. A tensor internal to the group (read only inside
it) pairs only with a candidate tensor of its own name: a fused op's lowering computes its
intermediates in another order (attention scales Q before Q.K^T, Gelu halves last), so an internal
tensor of the same op and shape may hold other values. The rest are reported as fused away, never
paired with a stranger. An original tensor no candidate node descends from is ``removed`` (folded
or dead); one whose node lives on inside a fused node but has no partner is ``fused away``.

A TVM artifact folder is compared by :mod:`passctl.tools.compare_tvm` (outputs from its
``model.so``, intermediates from a debug build of its ``ir.onnx``), with the same pairing.

Errors are :func:`passctl.support.check._diff_one`'s, in float64: max-abs, max-rel (over the
reference's largest magnitude), mean-rel and cosine.
"""

from __future__ import annotations

import html
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from passctl.ir.errors import UserError


# -- running with every tensor exposed ------------------------------------------------------------

def _expose_all(proto) -> List[str]:
    """Add every main-graph node output of ``proto`` (an ``onnx.ModelProto``, modified) as a graph
    output; return the names of the node outputs in graph order."""
    import onnx

    have = {o.name for o in proto.graph.output}
    names: List[str] = []
    for node in proto.graph.node:
        for name in node.output:
            if not name:
                continue
            names.append(name)
            if name not in have:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                have.add(name)
    return names


def run_exposed(proto, inputs: Dict[str, np.ndarray], what: str) -> Dict[str, np.ndarray]:
    """Run ``proto`` (copied) in ONNX Runtime (CPU, graph optimizations off, so no tensor is
    fused away by the runtime) with every node output exposed; return ``{name: array}``.

    Raises:
        UserError: the model does not run on ``inputs`` (``what`` names it).
    """
    import onnx
    import onnxruntime as ort

    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    _expose_all(proto)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
        feed = {i.name: inputs[i.name] for i in sess.get_inputs() if i.name in inputs}
        missing = [i.name for i in sess.get_inputs() if i.name not in inputs]
        if missing:
            raise UserError(f"{what}: no array for input(s) {', '.join(missing)}; give them in "
                            "--inputs FILE.npz")
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(names, feed)
    except UserError:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{what} does not run in ONNX Runtime on these inputs: {first}") from e
    return {n: np.asarray(v) for n, v in zip(names, values) if v is not None}


# -- pairing --------------------------------------------------------------------------------------

def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating) or a.dtype.name == "bfloat16"


def _dtype_class_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return (_is_float(a) and _is_float(b)) or a.dtype == b.dtype


@dataclass
class Pair:
    """One original tensor and its fate: ``status`` is ``paired`` (``candidate`` names its
    partner, ``diff`` the errors), ``fused-away`` (its node lives on in ``fused_into``, the
    candidate node names, but no tensor of it is this one), ``removed`` (no candidate node
    descends from its node) or, for a TVM artifact compared without a debug build,
    ``not-exposed`` (the compiled module returns its outputs only). ``source`` says where a TVM
    candidate's tensor came from (``shipped``: the artifact's model.so; ``debug-build``: a debug
    build of its IR, :mod:`passctl.tools.compare_tvm`); empty for ONNX Runtime candidates."""

    original: str
    node: str
    op_type: str
    index: int
    status: str
    candidate: Optional[str] = None
    candidate_node: Optional[str] = None
    candidate_op: Optional[str] = None
    provenance: Tuple[str, ...] = ()
    fused_into: Tuple[str, ...] = ()
    shape: Tuple[int, ...] = ()
    dtype: str = ""
    candidate_dtype: str = ""
    diff: Any = None
    source: str = ""

    def to_dict(self) -> Dict[str, Any]:
        d = {"original": self.original, "node": self.node, "op_type": self.op_type,
             "index": self.index, "status": self.status, "shape": list(self.shape),
             "dtype": self.dtype}
        if self.status == "paired":
            d.update(candidate=self.candidate, candidate_node=self.candidate_node,
                     candidate_op=self.candidate_op, candidate_dtype=self.candidate_dtype,
                     provenance=list(self.provenance), **_metrics(self.diff))
            if self.source:
                d["source"] = self.source
        elif self.fused_into:
            d["fused_into"] = list(self.fused_into)
        return d


def _metrics(diff) -> Dict[str, Any]:
    def number(x: float) -> Any:
        return x if math.isfinite(x) else str(x)
    return {"max_abs": number(diff.max_abs), "max_rel": number(diff.max_rel),
            "mean_rel": number(diff.mean_rel), "cosine": number(diff.cosine),
            "nonfinite_mismatch": diff.nonfinite_mismatch}


def _original_nodes(proto) -> List[Tuple[str, Any]]:
    """``(provenance key, NodeProto)`` of the main graph, keys as the importer gives them."""
    from passctl.ir.onnx_import import default_provenance

    return [(default_provenance(n.name, n.op_type, i)[0], n) for i, n in enumerate(proto.graph.node)]


def original_float_tensors(onodes, ref: Dict[str, np.ndarray]):
    """``(index, key, node, name, array)`` for each float tensor the original computes (outputs of
    :func:`_original_nodes`' nodes found float in ``ref``), in graph order; Constant nodes (weights,
    not computed tensors) are left out. The tensors every pairing reports on."""
    for index, (key, n) in enumerate(onodes):
        if n.op_type == "Constant" and not n.domain:
            continue
        for name in n.output:
            a = ref.get(name)
            if name and a is not None and _is_float(a):
                yield index, key, n, name, a


def pair_tensors(original_proto, candidate, ref: Dict[str, np.ndarray],
                 got: Dict[str, np.ndarray]) -> List[Pair]:
    """Pair the original's float tensors with the candidate's (module docstring's rules).

    Args:
        original_proto: the original ``onnx.ModelProto``.
        candidate: the candidate :class:`passctl.ir.Model` that ran (its main graph).
        ref, got: the exposed tensors of the original and the candidate by name.

    Returns:
        one :class:`Pair` per float tensor of the original that ran, in the original's graph order.
    """
    onodes = _original_nodes(original_proto)
    out_names = {o.name for o in original_proto.graph.output}
    consumers: Dict[str, List[str]] = {}
    for key, n in onodes:
        for name in n.input:
            consumers.setdefault(name, []).append(key)
    cnodes = list(candidate.graph)
    c_outputs = {v.name for v in candidate.graph.outputs}
    by_source: Dict[str, List[Any]] = {}
    for n in cnodes:
        for p in n.provenance:
            by_source.setdefault(p, []).append(n)
    c_position, c_values = {}, {}
    for i, n in enumerate(cnodes):
        for v in n.outputs:
            c_position[v.name] = (i, n)
            c_values[v.name] = v

    def c_leaves(v) -> bool:
        prov = set(v.producer.provenance)
        return v.name in c_outputs or any(not set(u.provenance) <= prov for u in v.consumers())

    def c_outside(v) -> set:
        prov = set(v.producer.provenance)
        out = {"<graph output>"} if v.name in c_outputs else set()
        for u in v.consumers():
            if not set(u.provenance) <= prov:
                out.update(set(u.provenance) - prov)
        return out

    def o_outside(name: str, v) -> set:
        prov = set(v.producer.provenance)
        out = {"<graph output>"} if name in out_names else set()
        return out | {k for k in consumers.get(name, ()) if k not in prov}

    def o_leaves(name: str, prov: set) -> bool:
        return name in out_names or any(k not in prov for k in consumers.get(name, ()))

    pairs: List[Pair] = []
    used: set = set()
    for index, key, n, name, a in original_float_tensors(onodes, ref):
        pair = Pair(name, key, n.op_type, index, "removed", shape=tuple(a.shape),
                    dtype=str(a.dtype))
        pairs.append(pair)
        descendants = by_source.get(key, [])
        if name in out_names and name in c_outputs and name in c_values:
            # a graph output keeps its name (the interface), whoever computes it now (an
            # eliminated Identity's output is its producer's)
            b = got.get(name)
            if b is not None and b.shape == a.shape and _dtype_class_equal(a, b):
                _accept(pair, c_values[name], got, a, used)
                continue
        if not descendants:
            continue
        pair.status = "fused-away"
        pair.fused_into = tuple(dict.fromkeys(d.name or d.op_type for d in descendants))
        options = []
        for d in descendants:
            for v in d.outputs:
                b = got.get(v.name)
                if b is not None and b.shape == a.shape and _dtype_class_equal(a, b):
                    options.append(v)
        if not options:
            continue
        named = [v for v in options if v.name == name]
        if named:
            _accept(pair, named[0], got, a, used)
            continue
        leaving = [v for v in options if c_leaves(v)]
        if o_leaves(name, set(options[0].producer.provenance)):
            # the tensor leaves its group: a candidate tensor leaving it towards the same
            # consumers carries it (the last one: after amp's Cast back, say); without a
            # shared consumer only a lone candidate does
            leaving = [v for v in leaving if o_leaves(name, set(v.producer.provenance))]
            free = [v for v in leaving if v.name not in used]
            shared = [v for v in free if c_outside(v) & o_outside(name, v)]
            if shared:
                _accept(pair, max(shared, key=lambda v: c_position[v.name][0]), got, a, used)
            elif len(free) == 1 and len(leaving) == 1:
                _accept(pair, free[0], got, a, used)
    return pairs


def _accept(pair: Pair, v, got: Dict[str, np.ndarray], a: np.ndarray, used: set) -> None:
    node = v.producer
    _accept_arrays(pair, v.name, node.name, node.op_type, tuple(node.provenance), a, got[v.name])
    used.add(v.name)


def _accept_arrays(pair: Pair, name: str, node: str, op: str, provenance: Tuple[str, ...],
                   a: np.ndarray, b: np.ndarray) -> None:
    """Mark ``pair`` paired with candidate tensor ``name`` (of ``node``, ``op``) holding ``b``."""
    from passctl.support.check import _diff_one

    pair.status = "paired"
    pair.candidate, pair.candidate_node, pair.candidate_op = name, node, op
    pair.provenance = provenance
    pair.candidate_dtype = str(b.dtype)
    pair.fused_into = ()
    pair.diff = _diff_one(pair.original, a.astype(np.float64), b.astype(np.float64))


# -- the candidate ----------------------------------------------------------------------------------

def runnable(model):
    """``model`` with passctl-only ops replaced through their standard lowering
    (``lower-standard``; lowered nodes keep the canonical node's provenance). Modified in place."""
    from passctl.passes.lowering.lower_standard import make_runnable

    make_runnable(model)
    return model


def last_dump_step(folder: str) -> str:
    """The last ``NNN_<pass>.onnx`` (else ``.pir``) of a ``--dump-ir`` folder.

    Raises:
        UserError: the folder holds no dump step.
    """
    steps = sorted(f for f in os.listdir(folder) if f[:3].isdigit() and f.endswith(".onnx"))
    steps = steps or sorted(f for f in os.listdir(folder) if f[:3].isdigit() and f.endswith(".pir"))
    if not steps:
        raise UserError(f"'{folder}' holds no model.onnx and no NNN_<pass>.onnx/.pir dump step; "
                        "give an artifact folder, a --dump-ir folder or a model file")
    return os.path.join(folder, steps[-1])


def load_candidate(original: str, candidate: Optional[str], pipeline: Optional[str],
                   target: str = "cpu", loads: Sequence[str] = ()):
    """The candidate :class:`passctl.ir.Model` and a label: ``pipeline`` run on the original, or
    ``candidate``: a model file, an artifact folder (its ``model.onnx``) or a ``--dump-ir`` folder
    (its last step).

    Raises:
        UserError: neither or both given, a file that does not load, a bad pipeline.
    """
    from passctl.tools.model_source import load_model

    for path in loads:
        from passctl.passes.registry import load_plugin_file

        load_plugin_file(path)
    if (candidate is None) == (pipeline is None):
        raise UserError("give the candidate: a model file, an artifact or --dump-ir folder, or "
                        "--pipeline P (one of them)")
    if pipeline is not None:
        from passctl.passes import PassManager
        from passctl.tools.opt import pipeline_passes

        passes = pipeline_passes(pipeline, target)
        model, _ = load_model(original)
        PassManager(passes).run(model)
        return model, f"{os.path.basename(original)} after {pipeline}"
    path = candidate
    if os.path.isdir(candidate):
        from passctl.targets.tvm.runtime import is_tvm_artifact

        if is_tvm_artifact(candidate):  # the CLI routes these to compare_tvm
            raise UserError(f"'{candidate}' is a TVM artifact: compare it with "
                            "passctl.tools.compare_tvm.compare_tvm (passctl compare does)")
        path = os.path.join(candidate, "model.onnx")
        if not os.path.isfile(path):
            path = last_dump_step(candidate)
    model, _ = load_model(path)
    return model, path


SHIPPED = "shipped"
DEBUG = "debug-build"
#: A debug build whose outputs differ from the shipped module's by more than this max-rel (the TVM
#: emitter's self-check bound for float32, ``SELF_CHECK_RTOL``) is reported as not reproducing it.
DEBUG_AGREEMENT = 1e-3


def describe(report) -> str:
    """The terminal's line on where the candidate's tensors came from."""
    info = report.tvm
    shipped = sum(p.source == SHIPPED for p in report.paired)
    debug = sum(p.source == DEBUG for p in report.paired)
    lib = info["shipped"].get("library") or "model.so"
    line = (f"TVM artifact: {shipped} output pair(s) from the shipped {lib} (tvm.runtime)")
    build = info["debug_build"]
    if build.get("built"):
        agree = info.get("debug_vs_shipped", {})
        worst = max(agree.values(), default=0.0)
        line += (f"; {debug} intermediate pair(s) from a debug build of ir.onnx ({build['exposed']} "
                 f"tensors made outputs, other kernels than {lib}'s; its outputs vs {lib}'s: "
                 f"max-rel {worst:.3g})")
        if worst > DEBUG_AGREEMENT:
            line += (f"; WARNING: over {DEBUG_AGREEMENT:g}, the debug build does not reproduce "
                     f"{lib}: its intermediates may differ from what {lib} computes")
    else:
        line += f"; no intermediates: {build.get('reason', 'no debug build')}"
    return line



# -- the report -----------------------------------------------------------------------------------

@dataclass
class CompareReport:
    """Pairs in the original's graph order, the first pair over the bound (``first_bad``) and the
    first where the error jumps (``jump``: over the bound and over 10x the largest error of any
    earlier pair)."""

    pairs: List[Pair]
    metric: str
    bound: float
    original: str
    candidate: str
    ir_text: str = ""
    first_bad: Optional[Pair] = None
    jump: Optional[Pair] = None
    outputs: Dict[str, Any] = field(default_factory=dict)
    tvm: Dict[str, Any] = field(default_factory=dict)

    @property
    def paired(self) -> List[Pair]:
        return [p for p in self.pairs if p.status == "paired"]

    def counts(self) -> Dict[str, int]:
        out = {"float_tensors": len(self.pairs)}
        for s in ("paired", "fused-away", "removed"):
            out[s] = sum(p.status == s for p in self.pairs)
        hidden = sum(p.status == "not-exposed" for p in self.pairs)
        if hidden:
            out["not-exposed"] = hidden
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"original": self.original, "candidate": self.candidate, "metric": self.metric,
                "bound": self.bound, "counts": self.counts(),
                "first_over_bound": self.first_bad.original if self.first_bad else None,
                "first_jump": self.jump.original if self.jump else None,
                "tensors": [p.to_dict() for p in self.pairs],
                **({"tvm": self.tvm} if self.tvm else {})}


def compare(original: str, candidate_model, inputs: Optional[Dict[str, np.ndarray]] = None,
            metric: str = "max-rel", bound: float = 1e-4, seed: int = 0,
            dims: Optional[Dict[str, int]] = None, label: str = "candidate") -> CompareReport:
    """Run ``original`` (an ONNX file) and ``candidate_model`` (a :class:`passctl.ir.Model`, modified:
    passctl-only ops lowered) on the same inputs and pair their tensors.

    Args:
        inputs: arrays by input name; default ``make_inputs(original, seed, dims)``.
        metric, bound: a pair is wrong when ``diff.error(metric) > bound`` (and ``max_abs`` over
            2.4e-7, two float32 ulps at 1).

    Raises:
        UserError: a model does not run on the inputs.
    """
    import onnx

    from passctl.ir.onnx_export import to_onnx
    from passctl.ir.printer import print_model
    from passctl.support.inputs import make_inputs

    proto = onnx.load(original)
    if inputs is None:
        inputs = make_inputs(proto, seed=seed, dim_values=dims or {})
    model = runnable(candidate_model)
    ref = run_exposed(proto, inputs, f"the original '{original}'")
    got = run_exposed(to_onnx(model), inputs, f"the candidate '{label}'")
    pairs = pair_tensors(proto, model, ref, got)
    try:
        text = print_model(model)
    except Exception:  # noqa: BLE001 - the IR text is a convenience of the page
        text = ""
    report = CompareReport(pairs, metric, bound, original, label, text)
    judge(report)
    return report


def judge(report: CompareReport) -> None:
    """Set ``report.first_bad`` and ``report.jump`` (see :class:`CompareReport`; a pair is wrong
    when ``diff.error(metric) > bound`` and ``max_abs`` > 2.4e-7, or on a non-finite mismatch)."""
    metric, bound = report.metric, report.bound
    worst = 0.0
    for p in report.paired:
        err = p.diff.error(metric)
        bad = (p.diff.nonfinite_mismatch > 0 or p.diff.problem is not None
               or (err > bound and p.diff.max_abs > 2.4e-7))
        if bad and report.first_bad is None:
            report.first_bad = p
        if bad and report.jump is None and (not math.isfinite(err) or err > 10 * worst):
            report.jump = p
        if math.isfinite(err):
            worst = max(worst, err)


def _fmt(x: float) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def print_table(report: CompareReport, console, rows: int = 12) -> None:
    """A short rich table: counts, the first wrong tensor, the worst pairs."""
    from rich.table import Table

    c = report.counts()
    hidden = f", {c['not-exposed']} not exposed" if c.get("not-exposed") else ""
    console.print(f"{c['float_tensors']} float tensors of the original: {c['paired']} paired, "
                  f"{c['fused-away']} fused away, {c['removed']} removed{hidden}", markup=False,
                  highlight=False)
    if report.tvm:
        console.print(describe(report), markup=False, highlight=False)
    if report.jump is not None:
        j = report.jump
        console.print(f"first tensor where the error jumps: '{j.original}' (node '{j.node}', "
                      f"{j.op_type}) -> candidate '{j.candidate}' ({j.candidate_op}), "
                      f"{report.metric} {j.diff.error(report.metric):.3g} > {report.bound:g}",
                      markup=False, highlight=False)
    else:
        console.print(f"no paired tensor exceeds {report.metric} {report.bound:g}", markup=False,
                      highlight=False)
    table = Table(title="worst paired tensors")
    cols = ["#", "original tensor", "candidate", "max-abs", "max-rel", "mean-rel", "cosine"]
    for col in cols + (["from"] if report.tvm else []):
        table.add_column(col)
    for p in _worst(report, rows):
        table.add_row(str(p.index), p.original, p.candidate, _fmt(p.diff.max_abs),
                      _fmt(p.diff.max_rel), _fmt(p.diff.mean_rel), _fmt(p.diff.cosine),
                      *([p.source] if report.tvm else []))
    console.print(table)


def _worst(report: CompareReport, n: int) -> List[Pair]:
    def key(p):
        e = p.diff.error(report.metric)
        return -(e if math.isfinite(e) else 1e300)
    return sorted(report.paired, key=key)[:n]


def _anchor(name: str) -> str:
    """The page's element id of the IR line defining tensor ``name`` (hex, so any name is safe)."""
    return "t-" + name.encode("utf-8").hex()


_DEFINED = None


def _defined_values(line: str) -> List[str]:
    """The value names an IR text line defines (``%a: T, %b: T = Op(...)``)."""
    import re

    global _DEFINED
    if _DEFINED is None:
        _DEFINED = re.compile(r'%("(?:[^"\\]|\\.)*"|[^\s:,=()]+)')
    lhs, sep, _ = line.strip().partition(" = ")
    if not sep or not lhs.startswith("%"):
        return []
    names = []
    for tok in _DEFINED.findall(lhs):
        names.append(json.loads(tok) if tok.startswith('"') else tok)
    return names


def _ir_html(report: CompareReport) -> str:
    """The IR text, each line that defines a paired candidate tensor carrying that tensor's
    anchor (so the table's and the plot's links land on the node)."""
    targets = {p.candidate for p in report.paired if p.candidate}
    lines = []
    for line in report.ir_text.splitlines():
        esc = html.escape(line)
        hits = [v for v in _defined_values(line) if v in targets]
        if hits:
            ids = "".join(f'<span id="{_anchor(v)}"></span>' for v in hits[1:])
            lines.append(f'<span id="{_anchor(hits[0])}">{ids}{esc}</span>')
            targets.difference_update(hits)
        else:
            lines.append(esc)
    return "\n".join(lines)


def _svg_plot(report: CompareReport, width: int = 720, height: int = 260) -> str:
    """Error (log10 of the metric) against depth (position in the original's graph order)."""
    pts = [(p.index, p.diff.error(report.metric)) for p in report.paired]
    if not pts:
        return '<svg id="plot" width="10" height="10"></svg>'
    xmax = max(i for i, _ in pts) or 1
    logs = [math.log10(max(e, 1e-12)) if math.isfinite(e) else 2.0 for _, e in pts]
    lo, hi = min(logs + [math.log10(report.bound)]) - 0.5, max(logs + [math.log10(report.bound)]) + 0.5
    m = 40

    def xy(i, l):
        return (m + (width - 2 * m) * i / xmax, height - m - (height - 2 * m) * (l - lo) / (hi - lo))

    parts = [f'<svg id="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="error against depth">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{m}" y1="{height - m}" x2="{width - m}" y2="{height - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{height - m}" stroke="black"/>']
    bx, by = xy(0, math.log10(report.bound))
    parts.append(f'<line class="bound" x1="{m}" y1="{by:.1f}" x2="{width - m}" y2="{by:.1f}" '
                 'stroke="red" stroke-dasharray="4"/>')
    path = " ".join(f"{'M' if k == 0 else 'L'}{xy(i, l)[0]:.1f},{xy(i, l)[1]:.1f}"
                    for k, ((i, _), l) in enumerate(zip(pts, logs)))
    parts.append(f'<path d="{path}" fill="none" stroke="#36c"/>')
    for (i, e), l, p in zip(pts, logs, report.paired):
        x, y = xy(i, l)
        color = "red" if p is report.jump else "#36c"
        parts.append(f'<a href="#{_anchor(p.candidate)}"><circle class="pt" '
                     f'cx="{x:.1f}" cy="{y:.1f}" r="{5 if p is report.jump else 3}" fill="{color}"><title>'
                     f'{html.escape(p.original)}: {e:.3g}</title></circle></a>')
    parts.append(f'<text x="{m}" y="{m - 10}" font-size="12">log10 {report.metric} '
                 f'[{lo:.1f}, {hi:.1f}] against depth (0..{xmax})</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_html(report: CompareReport, path: str, rows: int = 30) -> None:
    """``compare.html``: one self-contained page (no external resource): the counts, error against
    depth as an inline SVG, the worst tensors as a table whose candidate cells link to the node in
    the embedded IR text."""
    c = report.counts()
    jump = report.jump
    head = (f"<p id=\"jump\">first tensor where the error jumps: <b>{html.escape(jump.original)}"
            f"</b> (node {html.escape(jump.node)})</p>" if jump else
            f"<p id=\"jump\">no paired tensor exceeds {report.metric} {report.bound:g}</p>")
    rows_html = []
    for p in _worst(report, rows):
        rows_html.append(
            f"<tr><td>{p.index}</td><td>{html.escape(p.original)}</td>"
            f"<td><a href=\"#{_anchor(p.candidate)}\">"
            f"{html.escape(p.candidate or '')}</a></td><td>{html.escape(p.candidate_op or '')}</td>"
            f"<td>{_fmt(p.diff.max_abs)}</td><td>{_fmt(p.diff.max_rel)}</td>"
            f"<td>{_fmt(p.diff.mean_rel)}</td><td>{_fmt(p.diff.cosine)}</td>"
            f"<td>{html.escape(p.source)}</td></tr>")
    tvm_line = ""
    if report.tvm:
        tvm_line = f'<p id="tvm">{html.escape(describe(report))}</p>\n'
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>passctl compare</title>
<style>body{{font-family:sans-serif;margin:1em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:13px}} pre{{font-size:12px;background:#f6f6f6}}
pre span:target{{background:#ff0}}</style></head><body>
<h1>passctl compare</h1>
<p id="counts">{html.escape(report.original)} vs {html.escape(report.candidate)}:
{c['float_tensors']} float tensors, {c['paired']} paired, {c['fused-away']} fused away,
{c['removed']} removed{f", {c['not-exposed']} not exposed" if c.get("not-exposed") else ""}</p>
{tvm_line}{head}
<h2>error against depth</h2>
{_svg_plot(report)}
<h2>worst tensors</h2>
<table id="worst"><thead><tr><th>#</th><th>original tensor</th><th>candidate</th><th>op</th>
<th>max-abs</th><th>max-rel</th><th>mean-rel</th><th>cosine</th><th>from</th></tr></thead><tbody>
{''.join(rows_html)}
</tbody></table>
<h2>candidate IR</h2>
<pre id="ir">{_ir_html(report)}</pre>
</body></html>
"""
    _write_atomic(path, page)


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)



def parse_bound(text: str) -> Tuple[str, float]:
    """``METRIC=VALUE`` -> ``(metric, value)``.

    Raises:
        UserError: not that form, an unknown metric or a value that is not a number >= 0.
    """
    from passctl.support.check import METRICS

    metric, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not sep or metric not in METRICS or not number >= 0 or not math.isfinite(number):
        raise UserError(f"--bound '{text}': give METRIC=VALUE with METRIC one of "
                        f"{', '.join(METRICS)} and a number >= 0, e.g. max-rel=1e-4")
    return metric, number


def check_output_folder(path: str, option: str = "-o") -> None:
    """Raises UserError: ``path`` exists and is not a folder (checked before any run)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{option} '{path}' is a file; give a folder for the report")


def start(args):
    """The checks every ``passctl compare`` makes before running anything: ``(metric, bound)``.

    Raises:
        UserError: a bad ``--bound``, ``-o`` a file, or the original not a file.
    """
    metric, bound = parse_bound(args.bound)
    check_output_folder(args.output)
    if not os.path.isfile(args.original):
        raise UserError(f"'{args.original}' is not a file; give the original .onnx")
    return metric, bound


def main(args, console) -> int:
    """``passctl compare`` on ONNX Runtime candidates (TVM artifacts:
    :func:`passctl.tools.compare_tvm.main`, where the CLI routes them)."""
    metric, bound = start(args)
    from passctl.support.dims import parse_dim_args
    from passctl.support.input_files import load_input_file

    model, label = load_candidate(args.original, args.candidate, args.pipeline, args.target,
                                  args.load)
    report = compare(args.original, model, load_input_file(args.inputs) or None, metric,
                     bound, args.seed, parse_dim_args(args.dim), label)
    return write_outputs(report, args, console)


def write_outputs(report, args, console) -> int:
    """compare.json and compare.html into ``args.output``, the table on the terminal; 0."""
    os.makedirs(args.output, exist_ok=True)
    _write_atomic(os.path.join(args.output, "compare.json"),
                  json.dumps(report.to_dict(), indent=1))
    write_html(report, os.path.join(args.output, "compare.html"))
    print_table(report, console)
    console.print(f"wrote {os.path.join(args.output, 'compare.json')} and compare.html",
                  markup=False, highlight=False)
    return 0
