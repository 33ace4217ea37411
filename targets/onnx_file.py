"""The ONNX file of an artifact, shared by the emitters that write one (ONNX Runtime, TensorRT):
``model.onnx`` with its weights inline or in ``model.onnx.data``, and the load check that proves
ONNX Runtime (or the ONNX checker) accepts it."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Optional, Tuple, Union

from passctl.ir import Graph, Model, Tensor
from passctl.targets.base import EmitError

logger = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"

#: Above this many bytes of initializer data the weights go to ``model.onnx.data`` (protobuf
#: refuses messages over 2 GiB; external data also lets ONNX Runtime memory-map the weights).
EXTERNAL_DATA_THRESHOLD = 1 << 30

#: The session :func:`load_check` opened last, as ``(path, optimize, session)``, for
#: :func:`take_loaded_session` (the compile's verify run reuses it instead of loading again).
_LAST_SESSION: Optional[Tuple[str, Union[bool, str], Any]] = None


def take_loaded_session(path: str, optimize: Union[bool, str]):
    """The ONNX Runtime session :func:`load_check` opened on ``path`` at ``optimize`` (CPU
    provider, :func:`passctl.support.check.cpu_session`'s options), or None; either way the kept
    session is released."""
    global _LAST_SESSION
    kept, _LAST_SESSION = _LAST_SESSION, None
    if kept is not None and kept[0] == os.path.abspath(path) and kept[1] == optimize:
        return kept[2]
    return None


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
               optimize: Union[bool, str] = "ORT_ENABLE_ALL",
               weight_bytes: Optional[int] = None) -> Dict[str, Any]:
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

    A model with more than :func:`passctl.support.check.run_weight_limit` bytes of weights
    (``weight_bytes``, the emitter's count) is not opened in ONNX Runtime, which would hold about
    twice its weights in memory: it is validated with ``onnx.checker.check_model(path,
    full_check=True)``, which reads the graph but not the external data, and ``note`` says so.

    Returns:
        ``{"ok": True, "provider", "seconds", "inputs", "outputs"}`` (input / output names), plus
        ``note`` when the checker replaced the CPU session.

    Raises:
        EmitError: ONNX Runtime cannot load it (its first message line), or, for a GPU artifact
            without a CPU kernel, the checker refuses it.
    """
    from passctl.support.check import RUN_LIMIT_ENV, cpu_session, run_weight_limit

    global _LAST_SESSION
    _LAST_SESSION = None
    start = time.perf_counter()
    limit = run_weight_limit()
    if weight_bytes is not None and weight_bytes > limit:
        return _header_load_check(
            path, f"{weight_bytes / 1e9:.2f} GB of weights, over the {limit / 1e9:.2f} GB that "
                  f"compile opens in ONNX Runtime ({RUN_LIMIT_ENV})", start,
            note=f"not opened in ONNX Runtime: {weight_bytes / 1e9:.2f} GB of weights is over "
                 f"{RUN_LIMIT_ENV}={limit} (a session holds about twice the weights); only the "
                 "graph was read back (onnx.load without external data)")
    from passctl.support.check import quiet_stdout

    try:
        with quiet_stdout():  # ORT's "EP Error ... Falling back" prints: the EmitError says it
            sess = cpu_session(path, optimize=optimize)  # logs fatal only: the error has it
    except Exception as e:  # ORT raises its own exception types (Fail, InvalidGraph, ...)
        first = str(e).splitlines()[0]
        if gpu and "NOT_IMPLEMENTED" in first:
            return _checker_load_check(path, first, start)
        raise EmitError(f"ONNX Runtime cannot load the emitted model: {first}") from e
    seconds = time.perf_counter() - start
    _LAST_SESSION = (os.path.abspath(path), optimize, sess)
    return {
        "ok": True,
        "provider": "CPUExecutionProvider",
        "seconds": round(seconds, 4),
        "inputs": [i.name for i in sess.get_inputs()],
        "outputs": [o.name for o in sess.get_outputs()],
    }


def _header_load_check(path: str, why: str, start: float, note: str) -> Dict[str, Any]:
    """:func:`load_check` of a model too big to open: the file parses as ONNX (header only; the
    checker is not used since it refuses ONNX Runtime's contrib ops in the default domain, such
    as SimplifiedLayerNormalization)."""
    import onnx

    try:
        header = onnx.load(path, load_external_data=False)
    except Exception as e:  # DecodeError
        raise EmitError(f"the emitted model does not parse as ONNX: {str(e).splitlines()[0]}") from e
    weights = {t.name for t in header.graph.initializer}
    logger.info("load check of %s without ONNX Runtime (%s)", path, why)
    return {"ok": True, "provider": None, "seconds": round(time.perf_counter() - start, 4),
            "inputs": [i.name for i in header.graph.input if i.name not in weights],
            "outputs": [o.name for o in header.graph.output], "note": note}


def _checker_load_check(path: str, why: str, start: float,
                        note: Optional[str] = None) -> Dict[str, Any]:
    """:func:`load_check` by ``onnx.checker`` for a GPU artifact that ONNX Runtime's CPU provider
    has no kernel for, or (``note`` given) a model too big to open in a session."""
    import onnx

    try:
        onnx.checker.check_model(path, full_check=True)
    except Exception as e:  # ValidationError, InferenceError
        raise EmitError(f"the emitted model is not valid ONNX: {str(e).splitlines()[0]}") from e
    header = onnx.load(path, load_external_data=False)
    weights = {t.name for t in header.graph.initializer}
    if note is None:
        note = (f"ONNX Runtime's CPU provider cannot run it ({why.split(' : ')[-1]}); "
                "validated with onnx.checker (full check) instead")
    logger.info("load check of %s by onnx.checker instead of ONNX Runtime (%s)", path, why)
    return {"ok": True, "provider": None, "seconds": round(time.perf_counter() - start, 4),
            "inputs": [i.name for i in header.graph.input if i.name not in weights],
            "outputs": [o.name for o in header.graph.output], "note": note}
