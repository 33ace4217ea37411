"""``passctl compare ORIGINAL TVM_ARTIFACT``: the artifact's compiled module against the original.

Two sources of candidate tensors, each pair saying which it came from (``Pair.source``):

* ``shipped``: the artifact's graph outputs, from its own ``model.so`` run by
  :class:`passctl.targets.tvm.runtime.TvmArtifact` (``tvm.runtime``, the code that ships). Paired
  with the original's graph outputs by name.
* ``debug-build``: every other tensor, from :class:`passctl.targets.tvm.debug_build.DebugBuild`: the
  artifact's ``ir.onnx`` (the IR the emitter translated, with provenance) compiled again by the
  same route for the same target with every float tensor a graph output. These are TVM-computed
  values of that IR, but of other kernels than ``model.so``'s (exposing a tensor cuts a fusion
  group). They pair through provenance as for ONNX Runtime candidates
  (:func:`passctl.tools.compare.pair_tensors`). The debug build's own graph outputs are compared
  with the shipped module's (``report.tvm["debug_vs_shipped"]``: max-rel by output) so a debug
  build that computes something else shows.

Without ``ir.onnx`` (an artifact written before passctl kept it), a CUDA artifact, or when the
debug build fails, only the outputs are paired; the original's other tensors are
``not-exposed`` (or ``removed`` when no node of the IR descends from theirs).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

import numpy as np

from passctl.ir.errors import UserError

from passctl.tools.compare import DEBUG, SHIPPED


def artifact_dims(proto, manifest: Mapping[str, Any]) -> Dict[str, int]:
    """``{"<input>[<axis>]": size}`` for every non-static dimension of the original's inputs, from
    the artifact's static input shapes (``manifest["inputs"]``), so seeded inputs fit it."""
    specs = {i["name"]: i["shape"] for i in manifest.get("inputs", [])}
    inits = {t.name for t in proto.graph.initializer}
    dims: Dict[str, int] = {}
    for inp in proto.graph.input:
        shape = specs.get(inp.name)
        if inp.name in inits or shape is None or not inp.type.HasField("tensor_type"):
            continue
        declared = inp.type.tensor_type.shape.dim
        if len(declared) != len(shape):
            continue
        for axis, d in enumerate(declared):
            if not (d.HasField("dim_value") and d.dim_value > 0):
                dims[f"{inp.name}[{axis}]"] = int(shape[axis])
    return dims


def compare_tvm(original: str, folder: str, inputs: Optional[Dict[str, np.ndarray]] = None,
                metric: str = "max-rel", bound: float = 1e-4, seed: int = 0,
                dims: Optional[Dict[str, int]] = None):
    """Run ``original`` (ONNX Runtime, every tensor exposed) and the TVM artifact in ``folder``
    (its ``model.so``, and a debug build of its ``ir.onnx``) on the same inputs; pair the tensors.

    Args:
        inputs: arrays by input name; default ``make_inputs(original, seed, dims)`` with ``dims``
            defaulting to the artifact's static input shapes (:func:`artifact_dims`).
        metric, bound: as :func:`passctl.tools.compare.compare`.

    Returns:
        a :class:`passctl.tools.compare.CompareReport` whose ``tvm`` dict says what ran: ``shipped``
        (the outputs from ``model.so``), ``debug_build`` (``{"built", "exposed", "reason"}``) and
        ``debug_vs_shipped``.

    Raises:
        UserError: the artifact does not load (damaged, apache-tvm missing, a CUDA artifact on a
            machine without a GPU), or a model does not run on the inputs.
    """
    import onnx

    from passctl.support.check import _diff_one
    from passctl.support.inputs import make_inputs
    from passctl.targets.tvm.debug_build import DebugBuild
    from passctl.targets.tvm.ir_file import load_ir
    from passctl.tools.compare import CompareReport, judge, pair_tensors, run_exposed
    from passctl.tools.run_artifact import open_artifact

    proto = onnx.load(original)
    runner = open_artifact(folder)
    manifest = runner.tvm.manifest
    if inputs is None:
        inputs = make_inputs(proto, seed=seed, dim_values=dims or artifact_dims(proto, manifest))
    shipped = runner.run_checked(inputs, folder)
    ref = run_exposed(proto, inputs, f"the original '{original}'")
    ir = load_ir(folder)
    info: Dict[str, Any] = {"shipped": {"library": manifest.get("library"),
                                        "outputs": list(shipped)},
                            "debug_build": {"built": False}}
    debug: Dict[str, np.ndarray] = {}
    if ir is None:
        info["debug_build"]["reason"] = (f"'{folder}' has no ir.onnx (written by passctl compile "
                                         "since issue 19); compile again to compare intermediates")
    else:
        try:
            build = DebugBuild(load_ir(folder), manifest)
            debug = build.run(inputs)
        except UserError as e:
            info["debug_build"]["reason"] = str(e)
        except Exception as e:  # noqa: BLE001 - a debugging aid: the outputs still compare
            first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
            info["debug_build"]["reason"] = f"the debug build failed ({type(e).__name__}: {first})"
        else:
            info["debug_build"] = {"built": True, "file": "ir.onnx",
                                   "exposed": len(build.output_names) - len(shipped)}
            info["debug_vs_shipped"] = {
                n: _diff_one(n, shipped[n].astype(np.float64), debug[n].astype(np.float64)).max_rel
                for n in shipped if n in debug and shipped[n].dtype.kind == "f"
                and debug[n].shape == shipped[n].shape}
    got = {**debug, **shipped}
    if ir is None:
        pairs = _pair_outputs(proto, ref, shipped)
    else:
        pairs = pair_tensors(proto, ir, ref, got)
    for p in pairs:
        if p.status == "paired":
            p.source = SHIPPED if p.candidate in shipped else DEBUG
        elif p.status == "fused-away" and not debug:
            p.status, p.fused_into = "not-exposed", ()
    text = ""
    if ir is not None:
        try:
            from passctl.ir.printer import print_model

            text = print_model(ir)
        except Exception:  # noqa: BLE001 - the IR text is a convenience of the page
            text = ""
    report = CompareReport(pairs, metric, bound, original, folder, text)
    report.tvm = info
    judge(report)
    return report


def _pair_outputs(proto, ref: Dict[str, np.ndarray], shipped: Dict[str, np.ndarray]):
    """Without the IR: the original's graph outputs paired with the module's by name (same shape
    and dtype class); every other float tensor ``not-exposed``."""
    from passctl.tools.compare import Pair, _accept_arrays, _dtype_class_equal, _original_nodes, \
        original_float_tensors

    outs = {o.name for o in proto.graph.output}
    pairs = []
    for index, key, n, name, a in original_float_tensors(_original_nodes(proto), ref):
        pair = Pair(name, key, n.op_type, index, "not-exposed", shape=tuple(a.shape),
                    dtype=str(a.dtype))
        b = shipped.get(name)
        if name in outs and b is not None and b.shape == a.shape and _dtype_class_equal(a, b):
            _accept_arrays(pair, name, "", "", (), a, b)
        pairs.append(pair)
    return pairs


def wants_tvm(args) -> bool:
    """``passctl compare``'s candidate is a TVM artifact folder (then :func:`main` runs it)."""
    import os

    from passctl.targets.tvm.runtime import is_tvm_artifact

    return args.candidate is not None and os.path.isdir(args.candidate) and \
        is_tvm_artifact(args.candidate)


def main(args, console) -> int:
    """``passctl compare ORIGINAL TVM_ARTIFACT`` (the CLI routes here when :func:`wants_tvm`)."""
    from passctl.passes.registry import load_plugin_file
    from passctl.support.dims import parse_dim_args
    from passctl.support.input_files import load_input_file
    from passctl.tools.compare import start, write_outputs

    metric, bound = start(args)
    if args.pipeline is not None:
        raise UserError("give the candidate: a model file, an artifact or --dump-ir folder, "
                        "or --pipeline P (one of them)")
    for path in args.load:
        load_plugin_file(path)
    report = compare_tvm(args.original, args.candidate, load_input_file(args.inputs) or None,
                         metric, bound, args.seed, parse_dim_args(args.dim))
    return write_outputs(report, args, console)


__all__ = ["artifact_dims", "compare_tvm", "main", "wants_tvm"]
