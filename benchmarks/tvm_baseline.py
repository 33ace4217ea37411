"""TVM baselines the TVM benchmarks share: TVM's own ONNX import + default pipeline, the passctl-cleaned
export it needs for transformers graphs, and the error measure of every row."""

from __future__ import annotations

import contextlib
import io
import math
import time
import warnings
from typing import Callable, Dict, Optional, Tuple

import numpy as np


def max_rel(out, ref) -> float:
    """``max |out - ref| / max |ref|`` in float64 (:class:`passctl.support.check.OutputDiff`'s
    ``max_rel``), the error column of the TVM benchmark tables; nan when the NaN / inf positions
    differ."""
    from passctl.support.check import compare

    diff = compare({"y": ref}, {"y": out}).outputs["y"]
    return math.nan if diff.nonfinite_mismatch else diff.max_rel  # NaN outputs show as nan


def tvm_default(onnx_path: str, feeds: Dict[str, np.ndarray], target, device,
                quiet: bool = False) -> Tuple[Callable[[], object], np.ndarray, float]:
    """TVM's ONNX frontend (``tvm.relax.frontend.onnx.from_onnx`` with ``feeds``' static shapes and
    dtypes) then ``tvm.compile(mod, target)``: TVM's default pipeline, nothing from passctl.

    Args:
        onnx_path: the ONNX file.
        feeds: ``{input name: array}``; only the graph inputs named here become VM arguments.
        target: a ``tvm.target.Target``.
        device: the ``tvm.runtime.Device`` to run on (``tvm.cpu()``, ``tvm.cuda(0)``).
        quiet: silence the frontend's warnings and prints.

    Returns:
        ``(call, first output as numpy, build seconds)``; ``call()`` runs the VM on the bound inputs
        (asynchronously on GPU devices: sync ``device`` to time it). Build seconds cover loading,
        import and compile.

    Raises:
        Whatever TVM raises when it cannot import or compile the graph (the benchmarks report it).
    """
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    start = time.perf_counter()
    proto = onnx.load(onnx_path)
    with contextlib.ExitStack() as stack:
        if quiet:
            stack.enter_context(warnings.catch_warnings())
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            warnings.simplefilter("ignore")
        mod = from_onnx(proto, shape_dict={k: list(v.shape) for k, v in feeds.items()},
                        dtype_dict={k: str(v.dtype) for k, v in feeds.items()})
    ex = tvm.compile(mod, target=target)
    build = time.perf_counter() - start
    vm = relax.VirtualMachine(ex, device)
    args = [tvm.runtime.tensor(feeds[i.name], device) for i in proto.graph.input if i.name in feeds]

    def call():
        return vm["main"](*args)

    out = call()
    out = out if hasattr(out, "numpy") else out[0]
    return call, out.numpy(), build


def lower_tvm(dims: Optional[Dict[str, int]] = None) -> str:
    """The ``lower-tvm`` pipeline step fixing the symbolic ``dims`` (``{name or input[axis]: size}``)."""
    text = ",".join(f"{k}={v}" for k, v in (dims or {}).items())
    return f'lower-tvm{{dims="{text}"}}' if text else "lower-tvm"


def cleaned_export(onnx_path: str, profile: str, out: str,
                   dims: Optional[Dict[str, int]] = None) -> str:
    """Save ``onnx_path`` after passctl ``cleanup,lower-tvm{dims}`` for ``profile`` (shapes folded,
    scalar ConstantOfShape rewritten) as ``out``: TVM's default pipeline imports transformers exports
    from it when the raw file fails in its frontend (broadcast_to rank error). Returns ``out``."""
    from passctl.ir import load, save
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline

    model = load(onnx_path)
    PassManager(build_pipeline("cleanup," + lower_tvm(dims), profile, "tvm")).run(model)
    save(model, out)
    return out
