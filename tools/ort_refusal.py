"""Why ONNX Runtime refuses to load a model, as one line naming the node and op and what to do."""

from __future__ import annotations

import logging
import re
from typing import Optional, Tuple

logger = logging.getLogger(__name__)

#: Lowest ``ai.onnx`` opset ONNX Runtime has kernels for (its ``Only support models of onnx opset 7
#: and above`` warning); below it every node fails with ``Could not find an implementation``.
ORT_MIN_OPSET = 7

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STATUS = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_LOAD_FROM = re.compile(r"^Load model from .*? failed:")
_SOURCE = re.compile(r"^/?\S+\.(?:cc|h|cpp|hpp):\d+ ")
_NO_KERNEL = re.compile(r"Could not find an implementation for (\S+)\((\d+)\) node with name "
                        r"'([^']*)'")
_CUSTOM = re.compile(r"(\S+):(\w+)\((-?\d+)\) is not a registered function/op")
_OPSET = re.compile(r"Opset (\d+) is under development.*?domain (\S+) is till opset (\d+)")
_INFERENCE = re.compile(r"Node \(([^)]*)\) Op \(([^)]*)\) \[(Shape|Type)InferenceError\] (.*)")
_NO_OP = re.compile(r'In Node, \("([^"]*)", (\w+), "([^"]*)".*No Op registered for (\w+) with '
                    r"domain_version of (\d+)")


def clean_message(error: BaseException) -> str:
    """ONNX Runtime's exception text reduced to its first meaningful line.

    Strips ANSI colour escapes, the ``[ONNXRuntimeError] : N : CODE :`` status, ``Load model from
    PATH failed:``, ``Fatal error:`` and a leading C++ source location with its function signature
    (``/onnxruntime_src/...h:46 void onnxruntime::...(...) ``).
    """
    text = _ANSI.sub("", str(error)).strip()
    line = next((part.strip() for part in text.splitlines() if part.strip()), type(error).__name__)
    line = _LOAD_FROM.sub("", _STATUS.sub("", line)).strip()
    for prefix in ("Fatal error:", "Exception during initialization:"):
        if line.startswith(prefix):
            line = line[len(prefix):].strip()
    if _SOURCE.match(line):
        rest = _SOURCE.sub("", line, count=1)
        open_at = rest.find("(")
        if 0 <= open_at and "::" in rest[:open_at]:  # a C++ signature: skip its balanced parens
            depth = 0
            for i in range(open_at, len(rest)):
                depth += {"(": 1, ")": -1}.get(rest[i], 0)
                if depth == 0:
                    rest = rest[i + 1:]
                    break
            rest = rest.removeprefix(" const")
        line = rest.strip()
    return line


def _first_node(proto, domain: str, op_type: str) -> Optional[str]:
    """Name of the first main-graph node of ``domain::op_type`` (``None`` when there is none)."""
    for node in proto.graph.node:
        if node.op_type == op_type and node.domain in ((domain,) if domain not in ("", "ai.onnx")
                                                       else ("", "ai.onnx")):
            return node.name or f"#{list(proto.graph.node).index(node)}"
    return None


def _default_opset(proto) -> Optional[int]:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def _explain(line: str, proto) -> Tuple[str, str]:
    """``(what is wrong, naming node and op; what to do)`` for one cleaned ORT message."""
    m = _OPSET.search(line)
    if m:
        import onnx
        import onnx.defs

        have, domain, newest = m.groups()
        known = onnx.defs.onnx_opset_version()  # version_converter converts only from these
        todo = (f"convert it with onnx.version_converter.convert_version(model, {newest})"
                if int(have) <= known else
                f"export it again with opset <= {newest} (opset {have} is unknown to the installed "
                f"onnx {onnx.__version__}, whose version_converter stops at {known})")
        return (f"it imports opset {have} of domain {domain}, newer than the opset {newest} this "
                "ONNX Runtime supports", todo)
    m = _NO_KERNEL.search(line)
    if m:
        op, since, node = m.groups()
        opset = _default_opset(proto)
        if opset is not None and opset < ORT_MIN_OPSET:
            return (f"node '{node}' (op {op}): no kernel for opset {opset}; ONNX Runtime runs "
                    f"ai.onnx opsets {ORT_MIN_OPSET} and above",
                    "convert it with onnx.version_converter.convert_version(model, 17)")
        return (f"node '{node}' (op {op}, version {since}): ONNX Runtime's CPU provider has no "
                "kernel for it with these input types",
                "change the input types of that node (e.g. a Cast to float32) or the op")
    m = _CUSTOM.search(line)
    if m:
        domain, op, _ = m.groups()
        node = _first_node(proto, domain, op)
        where = f"node '{node}' (op {domain}::{op})" if node else f"op {domain}::{op}"
        return (f"{where} is a custom op with no kernel in ONNX Runtime",
                "rewrite it into standard ONNX ops (e.g. a pass given with --load FILE.py): "
                "ONNX Runtime runs it only with its custom-op library and --emit tvm refuses "
                "custom domains")
    m = _INFERENCE.search(line)
    if m:
        node, op, kind, detail = m.groups()
        return (f"node '{node}' (op {op}): {kind.lower()} inference fails: {detail.strip()}",
                "fix the model (onnx.shape_inference.infer_shapes(model, strict_mode=True) "
                "reports the same)")
    m = _NO_OP.search(line)
    if m:
        node, op, domain, _, version = m.groups()
        return (f"node '{node}' (op {op}): no op {op} in domain '{domain or 'ai.onnx'}' "
                f"opset {version}", "fix the op name or set the node's domain")
    short = line if len(line) <= 300 else line[:297] + "..."
    return short, ("fix the model so that onnxruntime.InferenceSession loads it (the full message "
                   "comes from loading it in Python)")


def explain_refusal(model_path: str, shown: str) -> Optional[str]:
    """Load ``model_path`` in ONNX Runtime (CPU provider, optimizations off); when it refuses,
    return a one-line message for a UserError, else ``None``.

    The message is ``"SHOWN: ONNX Runtime cannot load this model either: WHAT; WHAT TO DO"``,
    where WHAT names the node and op when ONNX Runtime's message allows (opset out of range, no
    kernel, custom op, shape or type inference error, unknown op), and WHAT TO DO points to
    ``onnx.version_converter``, a fix of the model or the custom op's kernels.

    Args:
        model_path: the ``.onnx`` file ONNX Runtime should load (external data next to it).
        shown: how the message names the model (the path the user gave).
    """
    import onnx

    from passctl.support.check import cpu_session

    try:
        cpu_session(model_path)
    except Exception as e:  # noqa: BLE001  (Fail, InvalidGraph, NotImplemented, ... of ORT)
        try:
            proto = onnx.load(model_path, load_external_data=False)
        except Exception:  # noqa: BLE001  (the message alone still helps)
            proto = onnx.ModelProto()
        what, todo = _explain(clean_message(e), proto)
        logger.debug("ONNX Runtime refuses %s: %s", model_path, e)
        return f"{shown}: ONNX Runtime cannot load this model either: {what}; {todo}"
    return None


def explain_level_refusal(model_path: str, shown: str, level: str) -> Optional[str]:
    """When ONNX Runtime's own graph optimizer refuses the original model ``model_path`` at
    ``level`` (the level the artifact would ship with, e.g. ``ORT_ENABLE_ALL``) although the model
    loads unoptimized: a one-line message for a UserError saying so and naming the highest lower
    level that loads it, with the ``--emit`` option that ships at that level; else ``None`` (the
    original loads at ``level``: an artifact that does not load is then passctl's problem).

    ONNX Runtime has such bugs (its level-3 optimizers refusing a valid model: "Failed to find
    node output or a constant initializer producing output"); passctl does not pick a lower level
    on its own, since the level decides which fused kernels the artifact runs with.

    Args:
        model_path: the original ``.onnx`` file (external data next to it).
        shown: how the message names the model (the path the user gave).
        level: the ``onnxruntime.GraphOptimizationLevel`` name the artifact ships with.
    """
    from passctl.support.check import cpu_session
    from passctl.support.check import quiet_stdout
    from passctl.targets.onnxruntime.emit import available_levels, short_level

    if level == "ORT_DISABLE_ALL":
        return None
    try:
        with quiet_stdout():
            cpu_session(model_path, optimize=level)
        return None
    except Exception as e:  # noqa: BLE001  (ORT's Fail, InvalidGraph, ...)
        refusal = clean_message(e)
    levels = available_levels()
    lower = levels[levels.index(level) + 1:] if level in levels else levels
    works = None
    for candidate in lower:
        try:
            with quiet_stdout():
                cpu_session(model_path, optimize=candidate)
        except Exception:  # noqa: BLE001
            continue
        works = candidate
        break
    if works is None:
        return None  # refused at every level: explain_refusal's case
    short = refusal if len(refusal) <= 200 else refusal[:197] + "..."
    return (f"{shown}: ONNX Runtime refuses this model itself at {level}, the level the artifact "
            f"would ship with, even unchanged by passctl ({short}): a limitation of ONNX Runtime's "
            f"graph optimizer, not of the model or passctl; it loads at {works}: compile with "
            f"--emit 'onnxruntime{{optimization_level={short_level(works)}}}' to ship at that level")
