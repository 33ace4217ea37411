"""Build a TensorRT engine from an emitted folder, where the ``tensorrt`` package and a GPU exist."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from typing import Any, Dict, Optional, Tuple

from passctl.support.profiles import TargetProfile
from passctl.targets.base import EmitError

logger = logging.getLogger(__name__)

ENGINE_FILE = "model.engine"


def local_compute_capability() -> Optional[Tuple[int, int]]:
    """The compute capability of GPU 0 as reported by ``nvidia-smi --query-gpu=compute_cap``
    (e.g. ``(9, 0)``), or None when there is no driver or no GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        major, minor = out.strip().splitlines()[0].strip().split(".")
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def engine_unavailable(target: TargetProfile) -> Optional[str]:
    """Why no engine for ``target`` can be built on this machine (one clause), or None when it can.

    An engine needs the ``tensorrt`` Python package (TensorRT >= 10: strongly typed networks) and
    a GPU of the target's compute capability: TensorRT engines are specific to the GPU model they
    were built on (TensorRT developer guide, "Serialized engines are not portable across
    platforms").
    """
    try:
        import tensorrt as trt
    except ImportError:
        trt = None
    if trt is None or not hasattr(trt, "Builder"):  # a folder named tensorrt imports as a namespace
        return ("the tensorrt Python package is not installed here (PyPI's tensorrt-*-libs "
                "download their libraries from NVIDIA's index)")
    major = int(str(getattr(trt, "__version__", "0")).split(".")[0] or 0)
    if major < 10:
        return f"tensorrt {trt.__version__} is installed; strongly typed networks need TensorRT >= 10"
    local = local_compute_capability()
    if local is None:
        return "no NVIDIA GPU is visible (nvidia-smi reports none)"
    if tuple(local) != tuple(target.compute_capability):
        return (f"the visible GPU is sm_{local[0]}{local[1]}, not the target's {target.sm} (an "
                "engine runs only on the GPU model it was built for)")
    return None


def build_engine(folder: str, manifest: Dict[str, Any]) -> Dict[str, Any]:
    """Build ``folder/model.engine`` from ``folder/model.onnx`` with the TensorRT Python API.

    The network is strongly typed (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``): every
    layer runs in the element types of the ONNX graph, so passctl's mixed-precision casts decide
    each layer's precision. TF32 is cleared unless ``manifest["tf32"]`` (TensorRT enables it by
    default, which changes fp32 results at the 1e-3 level). The optimization profile is
    ``manifest["optimization_profile"]``; ``manifest["workspace_bytes"]`` (when > 0) caps the
    builder's workspace memory pool.

    Returns:
        ``{"file", "seconds", "bytes", "tensorrt"}``.

    Raises:
        EmitError: the parser or the builder failed (the parser's first error is in the message).
    """
    import tensorrt as trt

    start = time.perf_counter()
    log = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(log)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log)
    if not parser.parse_from_file(os.path.join(folder, manifest["model"])):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EmitError(f"TensorRT's ONNX parser refused {manifest['model']}: "
                        f"{errors[0] if errors else 'no error given'}")
    config = builder.create_builder_config()
    if not manifest.get("tf32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    if manifest.get("workspace_bytes"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(manifest["workspace_bytes"]))
    profile_shapes = manifest.get("optimization_profile")
    if profile_shapes:
        profile = builder.create_optimization_profile()
        for name, rows in profile_shapes.items():
            profile.set_shape(name, rows["min"], rows["opt"], rows["max"])
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EmitError("TensorRT's builder returned no engine (its log above says why)")
    path = os.path.join(folder, ENGINE_FILE)
    with open(path + ".tmp", "wb") as f:
        f.write(serialized)
    os.replace(path + ".tmp", path)
    seconds = time.perf_counter() - start
    logger.info("TensorRT engine built in %.1f s (%d bytes)", seconds, os.path.getsize(path))
    return {"file": ENGINE_FILE, "seconds": round(seconds, 2), "bytes": os.path.getsize(path),
            "tensorrt": trt.__version__}


__all__ = ["ENGINE_FILE", "build_engine", "engine_unavailable", "local_compute_capability"]
