"""ONNX Runtime emitter: model.onnx (+ external data), session.json, and a load test."""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from passctl.ir import Model
# ONNX Runtime's optimization levels and their short names (OPTIMIZATION_LEVELS, available_levels,
# short_level: re-exported here) live in support/, where the budgeted passes name them too.
from passctl.support.ort_levels import OPTIMIZATION_LEVELS, available_levels, short_level  # noqa: F401
from passctl.support.ort_levels import SHORT_LEVELS as _SHORT_LEVELS
from passctl.support.profiles import TargetProfile
from passctl.targets.base import Emitter
from passctl.targets.onnx_file import EXTERNAL_DATA_THRESHOLD, MODEL_FILE, load_check, write_onnx
from passctl.targets.registry import register_emitter

logger = logging.getLogger(__name__)

def parse_level(text: str) -> str:
    """The ``onnxruntime.GraphOptimizationLevel`` name ``text`` gives: a short name (``all``,
    ``layout``, ``extended``, ``basic``, ``disable`` / ``off``) or the full name, any case.

    Raises:
        UserError: ``text`` names no level of the installed ONNX Runtime.
    """
    from passctl.ir.errors import UserError

    key = text.strip().lower()
    level = _SHORT_LEVELS.get(key) or next((n for n in OPTIMIZATION_LEVELS if n.lower() == key),
                                           None)
    if level is None or level not in available_levels():
        known = ", ".join(short_level(n) for n in available_levels())
        raise UserError(f"optimization_level='{text}' is not an ONNX Runtime graph optimization "
                        f"level; give one of {known} (or its ORT_* name)")
    return level


SESSION_FILE = "session.json"
SESSION_SCHEMA = "passctl.onnxruntime.session/1"


def _graph_precisions(model: Optional[Model]) -> Tuple[bool, bool]:
    """(has float16 / bfloat16 values, has QuantizeLinear nodes) in ``model``'s graphs."""
    if model is None:
        return False, False
    from passctl.ir import DataType

    half, int8 = False, False
    for node in model.graph.all_nodes():
        int8 = int8 or node.op_type == "QuantizeLinear"
        half = half or any(v.dtype in (DataType.FLOAT16, DataType.BFLOAT16) for v in node.outputs)
    return half, int8


def session_config(target: TargetProfile, model: Optional[Model] = None,
                   level: str = "ORT_ENABLE_ALL") -> Dict[str, Any]:
    """The ``session.json`` content for ``target``.

    Keys: ``schema``; ``model`` (file name); ``target`` (profile dict); ``graph_optimization_level``
    (an ``onnxruntime.GraphOptimizationLevel`` name: ``level``, the emitter's
    ``optimization_level``); ``intra_op_num_threads`` (0 = ONNX Runtime's
    default, one per physical core); ``execution_providers`` (``[name, options]`` pairs in priority
    order, ``CPUExecutionProvider`` last as fallback); ``optional_execution_providers`` (providers
    to put first when the runtime has them: the TensorRT EP on GPUs). The TensorRT EP's
    ``trt_fp16_enable`` is set only when ``model`` already computes in fp16 / bf16 (the amp pass's
    choice; enabling it on an fp32 graph would let TensorRT run any layer in fp16, a precision the
    check never saw) and the profile has fp16 units; ``trt_int8_enable`` only when ``model`` has
    Q/DQ nodes (the quantize pass's explicit quantization, which needs the INT8 builder flag in
    the EP's weakly typed builds; no calibration table: the scales are in the graph).
    """
    half, int8 = _graph_precisions(model)
    providers: List[List[Any]] = []
    for name in target.ort_providers:
        options: Dict[str, Any] = {}
        if name == "CUDAExecutionProvider":
            options = {"device_id": 0}
        providers.append([name, options])
    optional: List[List[Any]] = []
    for name in target.ort_optional_providers:
        if name == "TensorrtExecutionProvider":
            optional.append([name, {
                "device_id": 0,
                "trt_fp16_enable": half and target.supports("fp16"),
                "trt_int8_enable": int8 and target.supports("int8"),
                "trt_engine_cache_enable": True,
                "trt_engine_cache_path": "trt_cache",
            }])
    return {
        "schema": SESSION_SCHEMA,
        "model": MODEL_FILE,
        "target": target.to_dict(),
        "graph_optimization_level": level,
        "intra_op_num_threads": 0,
        "execution_providers": providers,
        "optional_execution_providers": optional,
    }


def chosen_providers(cfg: dict, providers: Optional[Sequence[str]] = None) -> list:
    """The ``(name, options)`` execution providers of ``session.json``'s ``cfg`` that this ONNX Runtime
    build has (only ``providers`` when given); ``[("CPUExecutionProvider", {})]`` when none is."""
    import onnxruntime as ort

    available = set(ort.get_available_providers())
    chosen = [(n, o) for n, o in cfg["execution_providers"]
              if n in available and (providers is None or n in providers)]
    return chosen or [("CPUExecutionProvider", {})]


def create_session(folder: str, providers: Optional[Sequence[str]] = None):
    """Open an emitted artifact as an ``onnxruntime.InferenceSession``.

    Reads ``folder/session.json``; uses its execution providers that this ONNX Runtime build has
    (always at least ``CPUExecutionProvider``), or only ``providers`` when given.

    Raises:
        FileNotFoundError: ``folder`` has no ``session.json``.
    """
    import onnxruntime as ort

    with open(os.path.join(folder, SESSION_FILE)) as f:
        cfg = json.load(f)
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only: warnings are not the user's business at run time
    level = cfg["graph_optimization_level"]
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = int(cfg["intra_op_num_threads"])
    chosen = chosen_providers(cfg, providers)
    return ort.InferenceSession(os.path.join(folder, cfg["model"]), so,
                                providers=[n for n, _ in chosen],
                                provider_options=[o for _, o in chosen])


def refuse_passctl_ops(model: Model) -> None:
    """Raises UserError naming the first node of ``model``'s main graph in a passctl-only domain
    (no runtime has kernels for it), with the lowering pass to add."""
    from passctl.ir.errors import UserError
    from passctl.passes.lowering.lower_standard import PASSCTL_DOMAINS

    left = [n for n in model.graph if n.domain in PASSCTL_DOMAINS]
    if left:
        n = left[0]
        raise UserError(f"node '{n.name}' is {n.domain}::{n.op_type}, a passctl-only op that ONNX "
                        f"Runtime cannot run ({len(left)} such node(s) left): add "
                        "lower-onnxruntime (or lower-standard) to --pipeline after the pass that "
                        "made it (the 'fuse' pipeline includes it)")


@register_emitter
class OnnxRuntimeEmitter(Emitter):
    """The ``onnxruntime`` emitter (the default for every target).

    Writes ``model.onnx`` (weights in ``model.onnx.data`` when they exceed
    ``external_data_threshold`` bytes) and ``session.json`` (see :func:`session_config`), then
    opens the model once in ONNX Runtime with the CPU provider to prove it loads.

    ``optimization_level`` is the graph optimization level ``session.json`` gives the session
    (default ``all``: ``ORT_ENABLE_ALL``; ``extended``, ``basic``, ``disable``: see
    :func:`parse_level`), for a model whose ONNX Runtime optimizer refuses the highest level.

    Raises:
        UserError: ``optimization_level`` names no level of the installed ONNX Runtime.
    """

    name = "onnxruntime"

    def __init__(self, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
                 optimization_level: str = "all"):
        self.external_data_threshold = external_data_threshold
        self.optimization_level = parse_level(optimization_level)

    def write(self, model: Model, target: TargetProfile, folder: str) -> Dict[str, Any]:
        """Write the artifact into ``folder`` (see :meth:`Emitter.write`).

        Returns:
            ``{"emitter", "files", "external_data", "weight_bytes", "session", "load_check",
            "runtime_only_ops"}`` where ``load_check`` is ``{"ok", "provider", "seconds", "inputs",
            "outputs"}`` and ``runtime_only_ops`` maps each ``domain::op`` only ONNX Runtime runs
            to its node count (empty when ``onnx.checker`` knows every op;
            :func:`passctl.passes.lowering.lower_onnxruntime.runtime_only_ops`).

        Raises:
            UserError: the graph still holds passctl-only ops (a fusion ran without the
                lowering that gives them an ONNX Runtime form).
            EmitError: ONNX Runtime cannot load the written model.
        """
        refuse_passctl_ops(model)
        path, nbytes, external = write_onnx(model, folder, self.external_data_threshold)
        cfg = session_config(target, model, self.optimization_level)
        with open(os.path.join(folder, SESSION_FILE), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        load = load_check(path, gpu=target.is_gpu, optimize=cfg["graph_optimization_level"],
                          weight_bytes=nbytes)
        files = sorted(os.listdir(folder))
        logger.info("onnxruntime artifact: %s (%d weight bytes, external=%s)", files, nbytes,
                    external)
        from passctl.passes.lowering.lower_onnxruntime import runtime_only_ops

        return {"emitter": self.name, "files": files, "external_data": external,
                "weight_bytes": nbytes, "session": SESSION_FILE, "load_check": load,
                "runtime_only_ops": runtime_only_ops(model)}
