"""The differential fuzzer: run generated graphs (:mod:`fuzz_graphs`) through ``passctl compile``
per pass family and compare the artifact, run in ONNX Runtime the way it ships (its
``session.json`` optimization level), with ONNX Runtime on the original at ``ORT_DISABLE_ALL``.

Each run is classified (:class:`Outcome`):

- ``OK``: exit 0 and every output agrees: same names, shapes and dtypes as the original returns,
  the shapes and dtypes the artifact declares, NaN/inf at the same positions, and the finite values
  within ``max(1e-5 * max |reference|, 2.4e-7)`` for float32 families (or, where not, within
  1e-5 relative of the float64 evaluation of the original beyond the original's own fp32 error:
  an ill-conditioned output whose fp32 rounding alone exceeds the bound, ``_compare_fp32``), or
  within the pass's budget under its metric (``mean-rel`` by default) for precision families
  (amp, quantize), measured on the
  pass's own calibration feeds (``make_inputs`` seeds 0 and 1, where the budget is promised);
- ``REFUSED``: exit 2, a one-line user-facing refusal;
- ``INTERNAL``: exit 3 (internal error, failed load check), any other exit code, or an exception;
- ``WRONG``: exit 0 but the artifact does not load or run, fails ``onnx.checker`` (other than
  for an op its ``report.json`` names in ``artifact.runtime_only_ops``), turns low-bit
  constants of the original into larger float ones, or returns a wrong shape,
  dtype or numbers.

The compile goes through :func:`passctl.tools.cli.main` in-process (the very code path of the
``passctl`` command, without a process start per run).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import onnx

from fuzz_graphs import FuzzGraph, GeneratorError, generate

OK, REFUSED, INTERNAL, WRONG = "OK", "REFUSED", "INTERNAL", "WRONG"
CLASSES = (OK, REFUSED, INTERNAL, WRONG)
ATTENTION_OPS = ("MultiHeadAttention", "GroupQueryAttention", "Attention")
FP32_RTOL, FP32_ATOL = 1e-5, 2.4e-7  # the CLI check's atol: two float32 ulps at 1.0


@dataclass(frozen=True)
class Family:
    """One pass family: the pipeline text, the target, the graph mix it is fed (a focus of
    :data:`fuzz_graphs.FOCI`) and whether it is a precision family (bounded by the pass's budget)."""

    name: str
    pipeline: str
    target: str = "cpu"
    foci: Tuple[str, ...] = ("mix",)
    precision: bool = False


FAMILIES: Dict[str, Family] = {f.name: f for f in (
    Family("cleanup", "cleanup", foci=("mix", "const", "norm")),
    Family("fuse", "cleanup,fuse", foci=("mix", "conv", "linear", "norm", "act", "attention")),
    Family("flash-attn", "cleanup,fuse,flash-attn", foci=("attention", "attention", "mix")),
    Family("reparam", "reparam", foci=("repvgg", "repvgg", "conv")),
    Family("amp", "cleanup,fuse,amp{dtype=fp16}", target="a10", foci=("mix", "linear", "conv"),
           precision=True),
    Family("quantize", "cleanup,fuse,quantize", foci=("mix", "linear", "conv", "repvgg"),
           precision=True),
)}
"""The families CI fuzzes (``tests/fuzz/test_fuzz.py``) and ``benchmarks/fuzz.py`` runs."""

EXTRA_FAMILIES: Dict[str, Family] = {f.name: f for f in (
    Family("flash-attn-only", "flash-attn", foci=("attention",)),
    Family("reparam-fuse", "reparam,cleanup,fuse", foci=("repvgg", "conv", "act")),
)}
"""More families ``benchmarks/fuzz.py --family`` accepts."""


def family(name: str) -> Family:
    """The family called ``name`` in :data:`FAMILIES` or :data:`EXTRA_FAMILIES`.

    Raises:
        KeyError: no such family (the message lists the known ones).
    """
    fams = {**FAMILIES, **EXTRA_FAMILIES}
    if name not in fams:
        raise KeyError(f"unknown family '{name}'; known: {', '.join(fams)}")
    return fams[name]


@dataclass
class Outcome:
    """The result of one graph through one family."""

    family: str
    seed: int
    focus: str
    kind: str
    reason: str = ""
    attention_written: int = 0
    attention_fused: int = 0
    attention_ops: int = 0
    tags: List[str] = field(default_factory=list)
    seconds: float = 0.0
    unfused: List[str] = field(default_factory=list)
    changed: bool = False

    def line(self) -> str:
        return (f"{self.kind:8s} family={self.family} seed={self.seed} focus={self.focus}: "
                f"{self.reason}  [{','.join(self.tags)}]")


def graph_for(fam: Family, seed: int) -> FuzzGraph:
    """The graph a family runs for ``seed`` (its focus cycles through ``fam.foci``)."""
    return generate(seed, fam.foci[seed % len(fam.foci)])


def _short(text: str, n: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _compile(model_path: str, out: str, fam: Family, work: str) -> Tuple[int, str]:
    """``passctl MODEL -p P -t T -o OUT -q`` in-process; returns (exit code, stderr)."""
    from passctl.tools.cli import main

    argv = [model_path, "-p", fam.pipeline, "-t", fam.target, "-o", out, "-q",
            "--reproducer-dir", os.path.join(work, "crash")]
    err, sout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(sout):
        try:
            rc = main(argv)
        except Exception as e:  # noqa: BLE001  (main should catch all; say so if not)
            return 99, f"main raised {type(e).__name__}: {e}"
    if rc == 130:  # main's answer to Ctrl-C: stop the whole fuzz run, not this graph only
        raise KeyboardInterrupt
    return rc, err.getvalue()


def _session(path: str, level: str):
    from passctl.support.check import cpu_session

    return cpu_session(path, optimize=level, threads=1)


def _run(path: str, level: str, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    sess = _session(path, level)
    names = [o.name for o in sess.get_outputs()]
    want = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in want})))


def _declared(model: onnx.ModelProto) -> Dict[str, Tuple[int, Optional[Tuple]]]:
    """``{output: (elem type, static shape or None)}`` as the artifact declares them."""
    out = {}
    for o in model.graph.output:
        t = o.type.tensor_type
        dims = None
        if t.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        out[o.name] = (t.elem_type, dims)
    return out


def _compare_fp32(ref: np.ndarray, got: np.ndarray,
                  exact: Optional[Callable[[], Optional[np.ndarray]]] = None) -> Optional[str]:
    """Why ``got`` (an fp32 artifact's output) disagrees with ``ref`` (ONNX Runtime's fp32 run of
    the original), or None: NaN/inf at other positions, or finite values off by more than
    ``max(1e-5 * max|ref|, 2.4e-7)``, unless the float64 evaluation of the original
    (``exact()``, :func:`passctl.support.exact.float64_outputs`) shows the difference is the
    original's own fp32 rounding: the artifact is then within 1e-5 relative of the exact answer
    beyond the original's own error (:func:`passctl.support.exact.rounding_excess`), as on an
    ill-conditioned output (a LayerNorm over rows equal in exact arithmetic, seed 6883)."""
    bad_r, bad_g = ~np.isfinite(ref), ~np.isfinite(got)
    if (bad_r != bad_g).any() or (np.isnan(ref) != np.isnan(got)).any():
        n = int(((bad_r != bad_g) | (np.isnan(ref) != np.isnan(got))).sum())
        return f"{n} NaN/inf positions differ"
    if bad_r.any() and (ref[bad_r & ~np.isnan(ref)] != got[bad_r & ~np.isnan(ref)]).any():
        return "inf signs differ"
    fin = ~bad_r
    if not fin.any():
        return None
    r, g = ref[fin].astype(np.float64), got[fin].astype(np.float64)
    err, scale = float(np.abs(r - g).max()), float(np.abs(r).max())
    if err > max(FP32_ATOL, FP32_RTOL * scale):
        why = (f"max abs error {err:.3g} > {FP32_RTOL:g} * max|ref| {scale:.3g} "
               f"(max-rel {err / max(scale, 1e-30):.3g})")
        e = exact() if exact is not None else None
        if e is None:
            return why + " (no float64 evaluation of the original to tell rounding from error)"
        from passctl.support.exact import rounding_excess

        excess = rounding_excess(ref, got, e)
        if excess > FP32_RTOL:
            return why + (f"; vs the float64 evaluation, {excess:.3g} relative beyond the "
                          "original's own fp32 error")
    return None


def _budget(fam: Family, model_path: str) -> List[Tuple[str, float]]:
    """The (metric, budget) bounds the family's passes promise (as the check derives them)."""
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline
    from passctl.support.context import CompileContext
    from passctl.targets import get_emitter, get_target
    from passctl.tools.numeric_check import check_bounds

    target = get_target(fam.target)
    emitter = get_emitter(target.default_emitter)
    ctx = CompileContext(target=target, emitter=emitter.name)
    flat = PassManager(build_pipeline(fam.pipeline, target.name, emitter.name, context=ctx)) \
        .flat_passes()
    return [(b.metric, b.rtol) for b in check_bounds(None, flat)]


_BUDGETS: Dict[str, List[Tuple[str, float]]] = {}


def _compare_budget(ref: np.ndarray, got: np.ndarray, bounds) -> Optional[str]:
    from passctl.support.check import compare

    bad_r, bad_g = ~np.isfinite(ref), ~np.isfinite(got)
    if (bad_r != bad_g).any():
        return f"{int((bad_r != bad_g).sum())} NaN/inf positions differ"
    diff = compare({"y": ref}, {"y": got.astype(ref.dtype)}).outputs["y"]
    for metric, budget in bounds:
        value = diff.error(metric)
        if not (value <= budget or diff.max_abs <= FP32_ATOL):
            return f"{metric} {value:.3g} > budget {budget:g}"
    return None


def _feeds_for(fam: Family, g: FuzzGraph, model_path: str) -> List[Dict[str, np.ndarray]]:
    if not fam.precision:
        return [g.feeds]
    from passctl.support.inputs import make_inputs

    return [make_inputs(model_path, seed=s) for s in (0, 1)]


def _judge(fam: Family, g: FuzzGraph, model_path: str, out: str) -> Optional[str]:
    """None when the artifact in ``out`` agrees with the original; else the one-line reason."""
    art = os.path.join(out, "model.onnx")
    try:
        with open(os.path.join(out, "session.json")) as f:
            level = json.load(f).get("graph_optimization_level", "ORT_ENABLE_ALL")
    except (OSError, ValueError) as e:
        return f"artifact folder has no readable session.json: {e}"
    proto = onnx.load(art)
    declared = _declared(proto)
    bounds = None
    if fam.precision:
        bounds = _BUDGETS.setdefault(fam.name, _budget(fam, model_path))
    for feeds in _feeds_for(fam, g, model_path):
        ref = _run(model_path, "ORT_DISABLE_ALL", feeds)
        exact = _exact_of(model_path, feeds, ref)
        why = _differs(fam, ref, art, level, feeds, declared, bounds, exact)
        if why is None:
            continue
        if level != "ORT_DISABLE_ALL":  # triage: passctl's rewrite or ONNX Runtime's optimizer?
            low = _differs(fam, ref, art, "ORT_DISABLE_ALL", feeds, declared, bounds, exact)
            orig = _differs(fam, ref, model_path, level, feeds, _declared(onnx.load(model_path)),
                            bounds, exact)
            why += (" (also at ORT_DISABLE_ALL)" if low else
                    f" (only at {level}; fine at ORT_DISABLE_ALL"
                    + ("; the original breaks too at " + level + ": ONNX Runtime's optimizer)"
                       if orig else ")"))
        return why
    # last, so that an artifact failing them is still judged on its numbers first
    try:
        onnx.checker.check_model(proto)
    except Exception as e:  # noqa: BLE001
        if not _declared_runtime_only(str(e), out):
            return f"onnx.checker refuses the artifact: {_short(e, 160)}"
    return _weights_grown(model_path, proto)


def _declared_runtime_only(checker_error: str, out: str) -> bool:
    """Whether ``onnx.checker`` refuses the artifact only for an op without an ONNX schema that
    the report names as ONNX Runtime-only (``artifact.runtime_only_ops``, issue 15 bug 11: "say
    in the report when an artifact is ONNX Runtime-only")."""
    import re

    m = re.search(r"No Op registered for (\S+) with domain_version", checker_error)
    if not m:
        return False
    try:
        with open(os.path.join(out, "report.json")) as f:
            declared = json.load(f).get("artifact", {}).get("runtime_only_ops") or {}
    except (OSError, ValueError):
        return False
    return any(key.split("::")[-1] == m.group(1) for key in declared)


def _exact_of(model_path: str, feeds, ref) -> Callable[[str], Optional[np.ndarray]]:
    """``exact(name)``: output ``name`` of the float64 evaluation of the original on ``feeds``
    (computed once, on first use; None where there is none)."""
    cache: List[Optional[Dict[str, np.ndarray]]] = []

    def exact(name: str) -> Optional[np.ndarray]:
        if not cache:
            from passctl.support.exact import float64_outputs

            cache.append(float64_outputs(model_path, feeds, check=ref))
        return None if cache[0] is None else cache[0].get(name)

    return exact


def _differs(fam: Family, ref, path: str, level: str, feeds, declared, bounds,
             exact: Optional[Callable[[str], Optional[np.ndarray]]] = None) -> Optional[str]:
    """Why the model at ``path`` run at ``level`` disagrees with the reference outputs ``ref``
    (None when it agrees): it fails, changes the outputs' names, shapes, dtypes, returns what it
    does not declare, or its numbers differ beyond the family's tolerance."""
    try:
        got = _run(path, level, feeds)
    except Exception as e:  # noqa: BLE001
        return f"artifact fails in ONNX Runtime at {level}: {_short(e, 200)}"
    if list(got) != list(ref):
        return f"outputs {list(got)} != original's {list(ref)}"
    for name, r in ref.items():
        a = got[name]
        if a.shape != r.shape:
            return f"output {name}: shape {list(a.shape)} != original's {list(r.shape)}"
        if a.dtype != r.dtype:
            return f"output {name}: dtype {a.dtype} != original's {r.dtype}"
        elem, dims = declared.get(name, (None, None))
        if elem != onnx.helper.np_dtype_to_tensor_dtype(a.dtype) or (
                dims is not None and (len(dims) != a.ndim or any(
                    d is not None and d != s for d, s in zip(dims, a.shape)))):
            return (f"output {name}: returns {a.dtype}{list(a.shape)} but the artifact "
                    f"declares {onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else '?'}"
                    f"{list(dims) if dims is not None else '?'}")
        why = (_compare_budget(r, a, bounds) if fam.precision else
               _compare_fp32(r, a, None if exact is None else (lambda n=name: exact(n))))
        if why:
            return f"output {name}: {why}"
    return None


_LOW_BIT = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4,
            onnx.TensorProto.UINT4}


def _constants(model: onnx.ModelProto) -> List[onnx.TensorProto]:
    out = list(model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            out += [a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
    return out


def _bytes(model: onnx.ModelProto, low_bit: bool) -> int:
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in _constants(model)
               if (t.data_type in _LOW_BIT) == low_bit)


def _weights_grown(model_path: str, artifact: onnx.ModelProto) -> Optional[str]:
    """A reason when the artifact lost low-bit (int8/uint8/int4) constants of the original and its
    other constants grew by more than it lost: low-bit weights folded back to float (issue 15,
    bug 7). (Float constants may grow for other reasons, e.g. a shared weight folded into two
    Convs.)"""
    original = onnx.load(model_path)
    lost = _bytes(original, True) - _bytes(artifact, True)
    grown = _bytes(artifact, False) - _bytes(original, False)
    if lost > 0 and grown > lost:
        return (f"{lost} bytes of low-bit constants became {grown} more bytes of float "
                "constants")
    return None


def _attention_counts(out: str) -> Tuple[int, int, List[str], bool]:
    """(passctl::Attention fused by fuse-attention, attention ops in the artifact, the reasons
    fuse-attention gives for the Softmax nodes it left, whether a pass other than the cleanup
    passes changed the graph)."""
    try:
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return 0, 0, [], False
    cleanup = ("infer-shapes", "eliminate-identity", "fold-constants", "cse", "dce")
    changed = any(p.get("modified") and p.get("name") not in cleanup
                  for p in report.get("passes", [])) or (
        all(p.get("name") in cleanup for p in report.get("passes", []))
        and any(p.get("modified") for p in report.get("passes", [])))
    runs = [p.get("stats", {}) for p in report.get("passes", [])
            if p.get("name") == "fuse-attention"]
    fused = sum(int(st.get("attention", 0) or 0) for st in runs)
    unfused = [str(u) for u in runs[-1].get("unfused", [])] if runs else []
    after = report.get("op_histogram", {}).get("after", {})
    ops = sum(int(n) for op, n in after.items()
              if op.split("::")[-1].split(".")[-1] in ATTENTION_OPS)
    return fused, ops, unfused, changed


def run_one(fam: Family, seed: int, work: str, save_dir: Optional[str] = None) -> Outcome:
    """Generate the graph of ``seed`` for ``fam``, compile it, judge the artifact."""
    start = time.perf_counter()
    try:
        g = graph_for(fam, seed)
    except GeneratorError as e:
        return Outcome(fam.name, seed, "?", INTERNAL, f"generator: {_short(e)}")
    except Exception as e:  # noqa: BLE001  (a generator bug: count it, keep fuzzing)
        return Outcome(fam.name, seed, "?", INTERNAL,
                       f"generator crashed: {type(e).__name__}: {_short(e)}")
    folder = tempfile.mkdtemp(prefix=f"{fam.name}-{seed}-", dir=work)
    model_path = os.path.join(folder, "model.onnx")
    onnx.save(g.model, model_path)
    out = os.path.join(folder, "out")
    outcome = Outcome(fam.name, seed, g.focus, OK, attention_written=g.attention, tags=list(g.tags))
    try:
        rc, err = _compile(model_path, out, fam, folder)
        lines = [ln for ln in err.splitlines()
                 if ln.startswith("passctl:") and not ln.startswith(("passctl: reproducer:",
                                                                       "passctl: warning:"))]
        message = _short(lines[-1] if lines else err.strip().splitlines()[-1] if err.strip()
                         else "")
        if rc == 0:
            (outcome.attention_fused, outcome.attention_ops, outcome.unfused,
             outcome.changed) = _attention_counts(out)
            try:
                why = _judge(fam, g, model_path, out)
            except Exception as e:  # noqa: BLE001
                why = f"judging failed: {type(e).__name__}: {_short(e, 200)}"
            if why:
                outcome.kind, outcome.reason = WRONG, why
        elif rc == 2:
            outcome.kind, outcome.reason = REFUSED, message
        else:
            outcome.kind, outcome.reason = INTERNAL, f"exit {rc}: {message}"
        if outcome.kind in (WRONG, INTERNAL) and save_dir:
            dest = os.path.join(save_dir, f"{fam.name}-{seed}")
            os.makedirs(dest, exist_ok=True)
            shutil.copy(model_path, os.path.join(dest, "model.onnx"))
            np.savez(os.path.join(dest, "inputs.npz"), **g.feeds)
            with open(os.path.join(dest, "README.txt"), "w") as f:
                f.write(f"{outcome.line()}\ncmd: passctl model.onnx -p '{fam.pipeline}' -t "
                        f"{fam.target} -o OUT --check"
                        f"{'' if fam.precision else ' --inputs inputs.npz --rtol 1e-5'}\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    outcome.seconds = time.perf_counter() - start
    return outcome


def reason_key(reason: str) -> str:
    """``reason`` with numbers and value names blanked, to group failures of one kind."""
    import re

    text = re.sub(r"'[^'\s]*'", "'_'", reason)
    text = re.sub(r"\b[a-z]{3,4}_\d+\b", "_", text)
    text = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return text[:160]


def grouped(outcomes: Iterable[Outcome]) -> List[Tuple[str, List[Outcome]]]:
    """Outcomes grouped by :func:`reason_key`, largest group first."""
    groups: Dict[str, List[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(f"{o.kind} {reason_key(o.reason)}", []).append(o)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


@dataclass
class Summary:
    """Counts per family, the failures, and how many graphs got attention fused."""

    outcomes: List[Outcome] = field(default_factory=list)

    def counts(self, fam: str) -> Dict[str, int]:
        c = {k: 0 for k in CLASSES}
        for o in self.outcomes:
            if o.family == fam:
                c[o.kind] += 1
        return c

    def families(self) -> List[str]:
        return list(dict.fromkeys(o.family for o in self.outcomes))

    def failures(self, kinds=(WRONG, INTERNAL)) -> List[Outcome]:
        return [o for o in self.outcomes if o.kind in kinds]

    def attention(self, fam: str) -> Dict[str, int]:
        mine = [o for o in self.outcomes if o.family == fam]
        return {"with_attention": sum(o.attention_written > 0 for o in mine),
                "fused": sum(o.attention_fused > 0 for o in mine),
                "attention_op": sum(o.attention_ops > 0 for o in mine)}

    def table(self) -> str:
        rows = [f"{'family':16s} {'graphs':>6s} " + " ".join(f"{k:>8s}" for k in CLASSES)
                + f" {'changed':>8s}   attention: written / fused / kernel op"]
        for fam in self.families():
            c = self.counts(fam)
            a = self.attention(fam)
            changed = sum(o.changed for o in self.outcomes if o.family == fam)
            rows.append(f"{fam:16s} {sum(c.values()):6d} "
                        + " ".join(f"{c[k]:8d}" for k in CLASSES) + f" {changed:8d}   "
                        + f"{a['with_attention']:5d} / {a['fused']:5d} / {a['attention_op']:5d}")
        return "\n".join(rows)


def run_many(families: Iterable[Family], seeds: Iterable[int], save_dir: Optional[str] = None,
             deadline: Optional[float] = None,
             progress: Optional[Callable[[Outcome], None]] = None) -> Summary:
    """Every seed through every family (seed-major, so a deadline cuts all families alike);
    stops at ``deadline`` (``time.monotonic()``) if given. ``save_dir``: where each WRONG or
    INTERNAL graph is written (:func:`run_one`); ``progress`` is called after every run."""
    summary = Summary()
    seeds = list(seeds)
    with tempfile.TemporaryDirectory(prefix="passctl-fuzz-") as work:
        families = list(families)
        for seed in seeds:
            for fam in families:
                if deadline is not None and time.monotonic() > deadline:
                    return summary
                o = run_one(fam, seed, work, save_dir)
                summary.outcomes.append(o)
                if progress:
                    progress(o)
    return summary


__all__ = ["CLASSES", "EXTRA_FAMILIES", "FAMILIES", "Family", "INTERNAL", "OK", "Outcome",
           "REFUSED", "Summary", "WRONG", "family", "graph_for", "grouped", "reason_key",
           "run_many", "run_one"]
