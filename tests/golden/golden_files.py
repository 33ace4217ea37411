"""Golden files of ``passctl opt``: read, run, compare, check numerically, regenerate (--update).

A golden file is IR text (``.pir``) that ``passctl opt`` reads as it is: the header, the expected
section and every other annotation are ``#`` comments. See tests/golden/README.md::

    # RUN: passctl opt %s -p fuse-conv-bn,dce --target cpu
    # CATCHES: what a change of the pass's output this case is meant to catch
    # NUMERIC: rtol=2e-3 (why)     (optional; default 1e-5, for fp32 passes)
    model ... { the input IR }
    # EXPECTED:
    # model ... { the IR after the pipeline, every line behind "# " }

Run as a script, it checks the given golden files (default: all) or, with ``--update``, rewrites
their expected sections from ``passctl opt``'s output. The test (test_golden.py) never writes.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from passctl.ir import Model, parse_model, print_model, structural_diff, to_onnx

GOLDEN_DIR = Path(__file__).resolve().parent
RUN, CATCHES, NUMERIC, EXPECTED = "# RUN:", "# CATCHES:", "# NUMERIC:", "# EXPECTED:"
DEFAULT_RTOL = 1e-5
_VALUE = re.compile(r'%(?:"(?:[^"\\]|\\.)*"|[A-Za-z0-9_./-]+)')


@dataclass
class Golden:
    """One golden file, split into its parts.

    Attributes:
        path: the file.
        run: the RUN line's command (``passctl opt %s -p ...``).
        catches: what the case is meant to catch (the CATCHES comment, continuation lines joined).
        rtol: the numeric check's bound on max |input - expected| / max |input|.
        input_text: everything before the EXPECTED marker (what ``passctl opt`` parses).
        expected_text: the expected IR (the marker's comment lines without ``# ``), or None.
    """

    path: Path
    run: str
    catches: str
    rtol: float
    input_text: str
    expected_text: Optional[str]


def golden_files() -> List[Path]:
    """Every ``tests/golden/<pass-or-family>/*.pir``, sorted."""
    return sorted(GOLDEN_DIR.glob("*/*.pir"))


def read_golden(path: Path) -> Golden:
    """Split a golden file into its parts.

    Raises:
        ValueError: no or several RUN lines, no CATCHES comment, a bad NUMERIC comment, or a line
            after the EXPECTED marker that is not a comment.
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    runs = [ln[len(RUN):].strip() for ln in lines if ln.startswith(RUN)]
    if len(runs) != 1:
        raise ValueError(f"{path}: needs exactly one '{RUN}' line, found {len(runs)}")
    catches = _comment_block(lines, CATCHES)
    if not catches:
        raise ValueError(f"{path}: needs a '{CATCHES}' comment saying what the case catches")
    numeric = _comment_block(lines, NUMERIC)
    rtol = DEFAULT_RTOL
    if numeric:
        m = re.match(r"rtol=(\S+) \(.+\)$", numeric)
        if not m:
            raise ValueError(f"{path}: '{NUMERIC} {numeric}': write 'rtol=X (why X)'")
        rtol = float(m.group(1))
    if EXPECTED not in lines:
        return Golden(Path(path), runs[0], catches, rtol, text, None)
    at = lines.index(EXPECTED)
    expected = []
    for n, ln in enumerate(lines[at + 1:], at + 2):
        if not ln.startswith("#"):
            raise ValueError(f"{path}:{n}: every line after '{EXPECTED}' must be a '# ' comment")
        expected.append(ln[2:] if ln.startswith("# ") else ln[1:])
    return Golden(Path(path), runs[0], catches, rtol, "\n".join(lines[:at]) + "\n",
                  "\n".join(expected) + "\n")


def _comment_block(lines: List[str], marker: str) -> str:
    """The text after ``marker`` plus its continuation lines (``#`` followed by 2+ spaces)."""
    for i, ln in enumerate(lines):
        if ln.startswith(marker):
            parts = [ln[len(marker):].strip()]
            for nxt in lines[i + 1:]:
                if not re.match(r"#\s{2,}\S", nxt):
                    break
                parts.append(nxt[1:].strip())
            return " ".join(parts)
    return ""


def run_argv(golden: Golden) -> List[str]:
    """The RUN line as ``passctl`` arguments, ``%s`` replaced by the file's path.

    Raises:
        ValueError: the RUN line is not ``passctl opt %s ...``.
    """
    words = shlex.split(golden.run)
    if words[:3] != ["passctl", "opt", "%s"]:
        raise ValueError(f"{golden.path}: the RUN line must start with 'passctl opt %s', "
                         f"got '{golden.run}'")
    return ["opt", str(golden.path)] + words[3:]


def run_opt(golden: Golden) -> str:
    """Run the RUN line in-process through the CLI's ``main`` (the code path of ``passctl opt``);
    return its stdout.

    Raises:
        AssertionError: the command exits non-zero (its stderr in the message).
    """
    from passctl.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(run_argv(golden))
    if rc != 0:
        raise AssertionError(f"{golden.path}: `{golden.run}` exited {rc}: {err.getvalue().strip()}")
    return out.getvalue()


def canonical_text(model: Model) -> str:
    """The model's IR text with node names dropped (their provenance printed as ``loc``) and
    values renamed ``%0, %1, ...`` in order of appearance: text that differs only where
    :func:`structural_diff` (``node_names=False``) sees a difference."""
    copy = parse_model(print_model(model), "<canonical>")
    for g in copy.graphs():
        for node in g:
            node.name = ""
    names: Dict[str, str] = {}
    return _VALUE.sub(lambda m: names.setdefault(m.group(0), f"%{len(names)}"),
                      print_model(copy))


def compare(actual_text: str, expected_text: str, path: str = "<golden>") -> Optional[str]:
    """None when the two IR texts are structurally equal (value and node names aside), else a
    message: the first difference, then a unified diff of their :func:`canonical_text`."""
    actual = parse_model(actual_text, f"{path} (passctl opt output)")
    expected = parse_model(expected_text, f"{path} (EXPECTED section)")
    diff = structural_diff(expected, actual, node_names=False)
    if diff is None:
        return None
    lines = difflib.unified_diff(canonical_text(expected).splitlines(),
                                 canonical_text(actual).splitlines(), "expected", "actual",
                                 lineterm="", n=2)
    return f"{path}: passctl opt output differs from EXPECTED: {diff}\n" + "\n".join(lines)


def expected_section(actual_text: str) -> str:
    """The EXPECTED section for ``actual_text``: the marker, then the IR with node names dropped
    (provenance kept as ``loc``; structural equality ignores node names), each line behind
    ``# ``."""
    model = parse_model(actual_text, "<passctl opt output>")
    for g in model.graphs():
        for node in g:
            node.name = ""
    body = print_model(model).rstrip("\n").splitlines()
    return "\n".join([EXPECTED] + [f"# {ln}".rstrip() for ln in body]) + "\n"


def update(path: Path) -> bool:
    """Rewrite ``path``'s EXPECTED section from ``passctl opt``'s output; True when it changed."""
    golden = read_golden(path)
    new = golden.input_text.rstrip("\n") + "\n" + expected_section(run_opt(golden))
    old = Path(path).read_text(encoding="utf-8")
    if new != old:
        Path(path).write_text(new, encoding="utf-8")
    return new != old


# -- numeric truth: the input and the expected IR compute the same outputs on ONNX Runtime -------
def numeric_error(golden: Golden, seed: int = 0) -> float:
    """Max over outputs of max |input - expected| / max |input| on ONNX Runtime's CPU provider
    (graph optimizations off) for seeded random inputs; NaNs must be at the same places (inf
    otherwise) and are left out. Canonical ``passctl::`` ops are lowered with
    ``lower-onnxruntime`` first (their lowering has its own tests)."""
    original = parse_model(golden.input_text, str(golden.path))
    expected = parse_model(golden.expected_text, f"{golden.path} (EXPECTED)")
    feeds = random_feeds(original, seed)
    errors = []
    for ref, got in zip(run_onnxruntime(original, feeds), run_onnxruntime(expected, feeds)):
        ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        assert ref.shape == got.shape, f"output shapes differ: {ref.shape} vs {got.shape}"
        if not np.array_equal(np.isnan(ref), np.isnan(got)):  # e.g. a fully masked attention row
            return float("inf")
        ref, got = ref[~np.isnan(ref)], got[~np.isnan(ref)]
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err = float(np.max(np.abs(ref - got))) if ref.size else 0.0
        errors.append(err / scale if scale > 0 else err)
    return max(errors)


def random_feeds(model: Model, seed: int = 0) -> Dict[str, np.ndarray]:
    """Seeded floats uniform in [-1, 1) as the CLI's ``--check`` draws them (integers in [0, 4),
    booleans) for each graph input that has no default; shapes must be static."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in model.graph.inputs:
        if model.graph.initializers.get(v.name) is v:
            continue
        shape = v.shape
        if shape is None or not shape.is_static:
            raise ValueError(f"input %{v.name}: golden inputs need static shapes, got {shape}")
        dims, dtype = tuple(int(d) for d in shape), v.dtype.numpy()
        if dtype == np.bool_:
            feeds[v.name] = rng.integers(0, 2, dims).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[v.name] = rng.integers(0, 4, dims).astype(dtype)
        else:
            feeds[v.name] = rng.uniform(-1.0, 1.0, dims).astype(np.float32).astype(dtype)
    return feeds


def run_onnxruntime(model: Model, feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """The model's outputs on ONNX Runtime's CPU provider, graph optimizations off."""
    import onnxruntime as ort

    if any(n.domain == "passctl" for g in model.graphs() for n in g):
        from passctl.passes import PassManager, build_pipeline

        PassManager(build_pipeline("lower-onnxruntime")).run(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(to_onnx(model).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {k: v for k, v in feeds.items()})


def main(argv: Optional[List[str]] = None) -> int:
    """Check golden files (default: all), or regenerate their EXPECTED sections with --update."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="golden files (default: all)")
    parser.add_argument("--update", action="store_true",
                        help="rewrite the EXPECTED sections from passctl opt's output")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.files or golden_files():
        if args.update:
            print(f"{'updated' if update(path) else 'unchanged'}: {path}")
            continue
        golden = read_golden(path)
        problem = ("no EXPECTED section" if golden.expected_text is None
                   else compare(run_opt(golden), golden.expected_text, str(path)))
        failed += problem is not None
        print(f"{'FAIL' if problem else 'ok'}: {path}" + (f"\n{problem}" if problem else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
