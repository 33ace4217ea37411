"""Write a TensorRT artifact: strongly typed ONNX, per-layer precision, trtexec script, engine."""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections import Counter
from typing import Any, Dict, List, Optional

import numpy as np

from passctl.ir import Model, Node
from passctl.ir.errors import UserError
from passctl.support.profiles import TargetProfile
from passctl.targets.base import Emitter, dtype_name, value_specs
from passctl.targets.onnx_file import (DATA_FILE, EXTERNAL_DATA_THRESHOLD, MODEL_FILE, load_check,
                                      write_onnx)
from passctl.targets.registry import register_emitter
from passctl.targets.tensorrt.engine import ENGINE_FILE, build_engine, engine_unavailable
from passctl.targets.tensorrt.shapes import (optimization_profile, parse_shape_ranges,
                                             trtexec_shapes)
from passctl.targets.tensorrt.support import TENSORRT_VERSION, check_support

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA = "passctl.tensorrt.artifact/1"
PRECISION_FILE = "precision.json"
SCRIPT_FILE = "build_engine.sh"


def layer_precision(node: Node) -> Optional[str]:
    """The element type ``node`` computes in, as a numpy dtype name (``"float16"``): that of its
    first floating-point output, else of its first typed output (an int8 QuantizeLinear, a bool
    comparison); for a node whose outputs carry no type (a lowering's new value), the same taken
    from its inputs; None when nothing is typed. In a strongly typed TensorRT network this is the
    layer's precision (TensorRT developer guide, "Strongly Typed Networks")."""
    for values in (node.outputs, node.inputs):
        names = [dtype_name(v) for v in values if v is not None]
        floats = [n for n in names if n is not None and np.issubdtype(np.dtype(n), np.floating)]
        found = floats[0] if floats else next((n for n in names if n is not None), None)
        if found is not None:
            return found
    return None


def precision_table(model: Model) -> Dict[str, Any]:
    """``precision.json``: ``{"strongly_typed": true, "summary": {dtype: layer count}, "layers":
    [{"node", "op", "output", "precision"}]}`` for every node of the main graph, in graph order
    (``output``: the first output's name, which identifies unnamed nodes)."""
    layers = [{"node": n.name, "op": n.qualified_op,
               "output": n.outputs[0].name if n.outputs else "", "precision": layer_precision(n)}
              for n in model.graph]
    summary = Counter(layer["precision"] or "untyped" for layer in layers)
    return {"strongly_typed": True, "summary": dict(sorted(summary.items())), "layers": layers}


def trtexec_command(manifest: Dict[str, Any]) -> List[str]:
    """The ``trtexec`` command that builds the same engine as :func:`build_engine`
    (``--stronglyTyped``, ``--noTF32`` unless tf32, the optimization profile's shapes)."""
    cmd = ["trtexec", f"--onnx={manifest['model']}", f"--saveEngine={ENGINE_FILE}", "--stronglyTyped"]
    if not manifest["tf32"]:
        cmd.append("--noTF32")
    if manifest["workspace_bytes"]:
        cmd.append(f"--memPoolSize=workspace:{manifest['workspace_bytes'] // (1 << 20)}M")
    profile = manifest["optimization_profile"]
    if profile:
        cmd += [f"--{row}Shapes={trtexec_shapes(profile, row)}" for row in ("min", "opt", "max")]
    return cmd


@register_emitter
class TensorRTEmitter(Emitter):
    """The ``tensorrt`` emitter: everything TensorRT needs, and the engine where it can be built.

    Writes ``model.onnx`` (standard ONNX after the pipeline's ``lower-standard``; weights in
    ``model.onnx.data`` above ``external_data_threshold`` bytes), ``precision.json`` (each layer's
    element type, see :func:`precision_table`), ``build_engine.sh`` (the ``trtexec`` command) and
    ``manifest.json`` (schema ``passctl.tensorrt.artifact/1``: model, target, inputs / outputs,
    ``optimization_profile``, ``tf32``, ``engine`` / ``engine_note``). The network is built
    strongly typed, so the graph's casts (the ``amp`` pass's per-layer choices, QDQ for int8) are
    the per-layer precision: TensorRT >= 10 builds exactly those types.

    Before writing, the model is checked against TensorRT's ONNX parser support matrix
    (:func:`passctl.targets.tensorrt.support.check_support`); after writing, ONNX Runtime opens
    ``model.onnx`` (and ``--check`` compares its outputs with the original model's).

    Args:
        shapes: size ranges of the dynamic input dims for the optimization profile:
            ``NAME=MIN:OPT:MAX`` or ``NAME=SIZE`` by ``dim_param`` or ``INPUT[AXIS]``
            (``"batch=1:8:32,sequence=128"``); required for every dynamic dim.
        build: build ``model.engine`` here: None (auto) when TensorRT and a GPU of the target's
            compute capability are present, True to require it, False never.
        tf32: let TensorRT run fp32 layers on TF32 tensor cores (its default; a precision change
            of about 1e-3 relative, so off unless asked for).
        workspace_mb: cap of the builder's workspace memory pool in MiB (0: TensorRT's default,
            the device memory).
        external_data_threshold: weight bytes above which they go to ``model.onnx.data``.
    """

    name = "tensorrt"
    # TensorRT's ONNX parser takes Q/DQ with zero points of 0 only (quantize-int8's GPU form).
    refused_forms = {"uint8-qdq": "TensorRT requires zero points of 0"}

    def __init__(self, shapes: str = "", build: Optional[bool] = None, tf32: bool = False,
                 workspace_mb: int = 0, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD):
        self.ranges = parse_shape_ranges(shapes)
        if workspace_mb < 0:
            raise UserError(f"TensorRT emitter workspace_mb={workspace_mb}: give a size in MiB, or 0 "
                            "for TensorRT's default")
        if external_data_threshold < 0:
            raise UserError(f"TensorRT emitter external_data_threshold={external_data_threshold}: "
                            "give a size in bytes (>= 0)")
        self.build = build
        self.tf32 = tf32
        self.workspace_mb = workspace_mb
        self.external_data_threshold = external_data_threshold

    def preflight(self, target: TargetProfile, check: bool = False) -> None:
        """Refuse the cpu target, and ``build=true`` where no engine can be built
        (see :meth:`Emitter.preflight`).

        Raises:
            UserError: one line with what to do instead.
        """
        self._check_target(target, engine_unavailable(target) if self.build else None)

    def _check_target(self, target: TargetProfile, why: Optional[str]) -> None:
        """:meth:`preflight`'s checks, given ``why`` no engine can be built here (None: it can)."""
        if not target.is_gpu:
            raise UserError(f"target '{target.name}': TensorRT runs on NVIDIA GPUs; give a GPU target "
                            "(a10, t4, l4, a100, h100, h200) or --emit onnxruntime / tvm for the CPU")
        if target.memory_bytes and (self.workspace_mb << 20) > target.memory_bytes:
            raise UserError(f"target '{target.name}': workspace_mb={self.workspace_mb} is more than "
                            f"its {target.memory_bytes / 1e9:g} GB of memory; give a smaller "
                            "workspace_mb, or 0 for TensorRT's default")
        if self.build and why is not None:
            raise UserError(f"target '{target.name}': build=true, but {why}; drop build=true to "
                            f"write everything up to the engine ({SCRIPT_FILE} builds it later)")

    def input_sizes(self, model: Model) -> Dict[str, int]:
        """The optimization profile's OPT sizes of the dynamic input dims (``{"x[0]": 4}``): what
        the engine is tuned for (see :meth:`Emitter.input_sizes`).

        Raises:
            UserError: a dynamic input dim has no range in ``shapes``.
        """
        profile = optimization_profile(model, self.ranges) or {}
        sizes: Dict[str, int] = {}
        for value in model.graph.inputs:
            if value.name in profile and value.shape is not None:
                sizes.update({f"{value.name}[{axis}]": profile[value.name]["opt"][axis]
                              for axis, dim in enumerate(value.shape.dims)
                              if not (isinstance(dim, int) and dim >= 0)})
        return sizes

    def write(self, model: Model, target: TargetProfile, folder: str) -> Dict[str, Any]:
        """Write the artifact into ``folder`` (see :meth:`Emitter.write`).

        Returns:
            the manifest plus ``{"emitter", "files", "weight_bytes", "load_check", "warnings"}``.

        Raises:
            UserError: an op or attribute TensorRT's parser refuses (the node, its op and
                provenance), or a dynamic input dim without a size range.
            EmitError: ONNX Runtime cannot load the written model, or the engine build failed.
        """
        why = engine_unavailable(target) if self.build is not False else "build=false"
        self._check_target(target, why)
        warnings = check_support(model)
        for line in warnings:
            logger.warning("%s", line)
        profile = optimization_profile(model, self.ranges)
        path, nbytes, _ = write_onnx(model, folder, self.external_data_threshold)
        load = load_check(path, gpu=True, optimize=False)  # TensorRT parses it as written
        manifest: Dict[str, Any] = {
            "schema": MANIFEST_SCHEMA,
            "model": MODEL_FILE,
            # ir.save keeps initializers under 1 KiB inline whatever the threshold: name the file
            # only when it was written
            "external_data": DATA_FILE if os.path.exists(os.path.join(folder, DATA_FILE)) else None,
            "target": target.to_dict(),
            "parser_support": f"TensorRT {TENSORRT_VERSION} ONNX parser (onnx-tensorrt operators.md)",
            "inputs": value_specs(model.graph.inputs),
            "outputs": value_specs(model.graph.outputs),
            "optimization_profile": profile,
            "strongly_typed": True,
            "tf32": self.tf32,
            "workspace_bytes": self.workspace_mb << 20,
            "precision": PRECISION_FILE,
            "engine": None,
            "engine_note": "",
        }
        manifest["trtexec"] = trtexec_command(manifest)
        _write_json(os.path.join(folder, PRECISION_FILE), precision_table(model))
        with open(os.path.join(folder, SCRIPT_FILE), "w") as f:
            f.write("#!/usr/bin/env bash\n# Builds model.engine on a machine with TensorRT >= 10 and a "
                    f"{target.sm} GPU ({target.name}).\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n"
                    + " ".join(shlex.quote(a) for a in manifest["trtexec"]) + "\n")
        os.chmod(os.path.join(folder, SCRIPT_FILE), 0o755)
        if why is None:
            engine = build_engine(folder, manifest)
            manifest.update(engine=engine["file"], engine_build=engine)
        else:
            manifest["engine_note"] = (f"no engine built: {why}; run {SCRIPT_FILE} on a machine "
                                       f"with TensorRT >= 10 and a {target.sm} GPU")
            logger.warning("TensorRT engine not built: %s; %s has the trtexec command", why,
                           SCRIPT_FILE)
        _write_json(os.path.join(folder, MANIFEST_FILE), manifest)
        return {"emitter": self.name, **manifest, "files": sorted(os.listdir(folder)),
                "weight_bytes": nbytes, "load_check": load, "warnings": warnings}


def _write_json(path: str, data: Any) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def is_tensorrt_artifact(folder: str) -> bool:
    """Whether ``folder`` holds a passctl TensorRT artifact (a manifest with its schema)."""
    try:
        with open(os.path.join(folder, MANIFEST_FILE)) as f:
            return json.load(f).get("schema") == MANIFEST_SCHEMA
    except (OSError, ValueError):
        return False


__all__ = ["MANIFEST_SCHEMA", "TensorRTEmitter", "is_tensorrt_artifact", "layer_precision",
           "precision_table", "trtexec_command"]
