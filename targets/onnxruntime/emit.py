"""ONNX Runtime emitter: model.onnx (+ external data), session.json, and a load test."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from passctl.ir import Graph, Model, Tensor
from passctl.targets.base import EmitError, Emitter
from passctl.support.profiles import TargetProfile

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
SESSION_FILE = "session.json"
SESSION_SCHEMA = "passctl.onnxruntime.session/1"

#: Above this many bytes of initializer data the weights go to ``model.onnx.data`` (protobuf
#: refuses messages over 2 GiB; external data also lets ONNX Runtime memory-map the weights).
EXTERNAL_DATA_THRESHOLD = 1 << 30


def weight_bytes(graph: Graph) -> int:
    """Bytes of constant data in ``graph`` and its subgraphs: initializers and tensor attributes."""
    total = sum(v.const.nbytes for v in graph.initializers.values() if v.const is not None)
    for node in graph:
        for attr in node.attributes.values():
            if isinstance(attr.value, Tensor):
                total += attr.value.nbytes
        for sub in node.subgraphs():
            total += weight_bytes(sub)
    return total


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


def session_config(target: TargetProfile, model: Optional[Model] = None) -> Dict[str, Any]:
    """The ``session.json`` content for ``target``.

    Keys: ``schema``; ``model`` (file name); ``target`` (profile dict); ``graph_optimization_level``
    (an ``onnxruntime.GraphOptimizationLevel`` name); ``intra_op_num_threads`` (0 = ONNX Runtime's
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
        "graph_optimization_level": "ORT_ENABLE_ALL",
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


class OnnxRuntimeEmitter(Emitter):
    """The ``onnxruntime`` emitter (the default for every target).

    Writes ``model.onnx`` (weights in ``model.onnx.data`` when they exceed
    ``external_data_threshold`` bytes) and ``session.json`` (see :func:`session_config`), then
    opens the model once in ONNX Runtime with the CPU provider to prove it loads.
    """

    name = "onnxruntime"

    def __init__(self, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD):
        self.external_data_threshold = external_data_threshold

    def write(self, model: Model, target: TargetProfile, folder: str) -> Dict[str, Any]:
        """Write the artifact into ``folder`` (see :meth:`Emitter.write`).

        Returns:
            ``{"emitter", "files", "external_data", "weight_bytes", "session", "load_check"}``
            where ``load_check`` is ``{"ok", "provider", "seconds", "inputs", "outputs"}``.

        Raises:
            EmitError: ONNX Runtime cannot load the written model.
        """
        path, nbytes, external = write_onnx(model, folder, self.external_data_threshold)
        cfg = session_config(target, model)
        with open(os.path.join(folder, SESSION_FILE), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        load = load_check(path, gpu=target.is_gpu, optimize=cfg["graph_optimization_level"])
        files = sorted(os.listdir(folder))
        logger.info("onnxruntime artifact: %s (%d weight bytes, external=%s)", files, nbytes,
                    external)
        return {"emitter": self.name, "files": files, "external_data": external,
                "weight_bytes": nbytes, "session": SESSION_FILE, "load_check": load}


def write_onnx(model: Model, folder: str,
               external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> Tuple[str, int, bool]:
    """Save ``model`` as ``folder/model.onnx``, its weights in ``model.onnx.data`` when they exceed
    ``external_data_threshold`` bytes.

    Returns:
        ``(path, weight bytes, external)``.
    """
    from passctl.ir.onnx_export import save

    nbytes = weight_bytes(model.graph)
    external = nbytes > external_data_threshold
    path = os.path.join(folder, MODEL_FILE)
    save(model, path, external_data=external, location=DATA_FILE if external else None)
    return path, nbytes, external


def load_check(path: str, gpu: bool = False,
               optimize: Union[bool, str] = "ORT_ENABLE_ALL") -> Dict[str, Any]:
    """Open the ONNX file ``path`` in ONNX Runtime (CPU provider, session options from
    :func:`passctl.support.check.cpu_session`) to prove it is a valid model.

    ``optimize`` is the graph optimization level the session loads with, that of how the artifact
    is run: ``session.json``'s level for an ONNX Runtime artifact; ``False`` (``ORT_DISABLE_ALL``)
    for a model another runtime parses as written (TensorRT), where ONNX Runtime's CPU graph
    rewrites would be work for nothing.

    For a GPU artifact (``gpu``), a missing CPU kernel (ONNX Runtime's NOT_IMPLEMENTED: the CPU
    execution provider has no bfloat16 MatMul or Conv, which CUDA and TensorRT run) does not make
    the model invalid: it is then validated with ``onnx.checker.check_model(full_check=True)``
    (strict shape and type inference) instead, and ``note`` says so.

    Returns:
        ``{"ok": True, "provider", "seconds", "inputs", "outputs"}`` (input / output names), plus
        ``note`` when the checker replaced the CPU session.

    Raises:
        EmitError: ONNX Runtime cannot load it (its first message line), or, for a GPU artifact
            without a CPU kernel, the checker refuses it.
    """
    from passctl.support.check import cpu_session

    start = time.perf_counter()
    try:
        sess = cpu_session(path, optimize=optimize)  # logs fatal only: the error has it
    except Exception as e:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
        first = str(e).splitlines()[0]
        if gpu and "NOT_IMPLEMENTED" in first:
            return _checker_load_check(path, first, start)
        raise EmitError(f"ONNX Runtime cannot load the emitted model: {first}") from e
    seconds = time.perf_counter() - start
    return {
        "ok": True,
        "provider": "CPUExecutionProvider",
        "seconds": round(seconds, 4),
        "inputs": [i.name for i in sess.get_inputs()],
        "outputs": [o.name for o in sess.get_outputs()],
    }


def _checker_load_check(path: str, why: str, start: float) -> Dict[str, Any]:
    """:func:`load_check` for a GPU artifact that ONNX Runtime's CPU provider has no kernel for."""
    import onnx

    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # ValidationError, InferenceError
        raise EmitError(f"the emitted model is not valid ONNX: {str(e).splitlines()[0]}") from e
    header = onnx.load(path, load_external_data=False)
    weights = {t.name for t in header.graph.initializer}
    logger.info("ONNX Runtime's CPU provider has no kernel for this GPU artifact (%s); validated "
                "with onnx.checker instead", why)
    return {"ok": True, "provider": None, "seconds": round(time.perf_counter() - start, 4),
            "inputs": [i.name for i in header.graph.input if i.name not in weights],
            "outputs": [o.name for o in header.graph.output],
            "note": f"ONNX Runtime's CPU provider cannot run it ({why.split(' : ')[-1]}); "
                    "validated with onnx.checker (full check) instead"}
