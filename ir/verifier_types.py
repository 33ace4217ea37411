"""Verifier check of declared graph-output types against ONNX shape inference (warnings)."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Dict, List, Optional, Tuple

import onnx
import onnx.shape_inference

from passctl.ir._core import Model
from passctl.ir._types import TensorType

logger = logging.getLogger(__name__)

# Float weights bigger than this are replaced by a data-less stand-in before inference (they never
# decide a shape, and copying them makes inference slow on large models).
_STRIP_ELEMENTS = 1024
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE}


def output_type_diagnostics(model: Model) -> List:
    """Compare each declared main-graph output type with the inferred one.

    The model is exported with ``passctl.ir.to_onnx``; the outputs' declared shapes and all
    ``value_info`` are dropped; ``onnx.shape_inference.infer_shapes`` (with data propagation)
    recomputes them. Where ONNX leaves an output's shape unknown while the model declares one, ONNX
    Runtime's symbolic shape inference (``onnxruntime.tools.symbolic_shape_infer``) is tried too.
    A different element type, rank, or static dimension gives a WARNING of kind ``output-type``.
    When the export or both inferences fail the check is skipped (logged at INFO).

    Returns:
        A list of :class:`passctl.ir.verifier.Diagnostic` (severity ``"warning"``).
    """
    from passctl.ir.diagnostics import OUTPUT_TYPE, Diagnostic

    declared = [(v, v.type) for v in model.graph.outputs]
    if not any(isinstance(t, TensorType) for _, t in declared):
        return []
    try:
        from passctl.ir.onnx_export import to_onnx

        proto = to_onnx(model)
    except Exception as e:  # noqa: BLE001 - the check is advisory; a broken IR is reported elsewhere
        logger.info("verifier: output-type check skipped, export failed: %s", e)
        return []
    _prepare(proto)
    inferred_model = _infer_model(proto, symbolic=False)
    if inferred_model is None:
        return []
    inferred = _output_types(inferred_model)
    unknown = [i for i, (_, t) in enumerate(declared) if isinstance(t, TensorType)
               and t.shape is not None and inferred.get(i, (0, None))[1] is None]
    if unknown:
        better_model = _infer_model(proto, symbolic=True)
        better = _output_types(better_model) if better_model is not None else {}
        for i in unknown:
            if better.get(i, (0, None))[1] is not None:
                inferred[i] = better[i]
            else:
                rank = _reshape_rank(inferred_model, i)
                if rank is not None:
                    inferred[i] = (inferred.get(i, (0, None))[0], (None,) * rank)
    diags = []
    for i, (v, t) in enumerate(declared):
        if not isinstance(t, TensorType) or i not in inferred:
            continue
        problem = _disagreement(t, *inferred[i])
        if problem:
            diags.append(Diagnostic(
                "warning", OUTPUT_TYPE,
                f"graph output {i} '%{v.name}' is declared {_fmt(int(t.dtype), _dims(t))} but shape "
                f"inference computes {_fmt(*inferred[i])} ({problem})", v.producer,
                highlight=v.name))
    return diags


def _prepare(proto: onnx.ModelProto) -> None:
    del proto.graph.value_info[:]
    for o in proto.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.tensor_type.ClearField("shape")
    for init in proto.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        if init.data_type in _FLOAT_TYPES and n > _STRIP_ELEMENTS and init.HasField("raw_data"):
            init.ClearField("raw_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            entry = init.external_data.add()
            entry.key, entry.value = "location", "passctl-stripped-weights"


def _symbolic_shape_inference():
    """ONNX Runtime's ``SymbolicShapeInference`` class, loaded from its file: importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs ``onnxruntime/tools/__init__.py``, which imports
    torch (about 5 s of a 10 s ``passctl verify``; the module itself needs only onnx, numpy and
    sympy). Cached after the first load."""
    global _SYMBOLIC
    if _SYMBOLIC is None:
        import importlib.util

        import onnxruntime

        path = os.path.join(os.path.dirname(onnxruntime.__file__), "tools", "symbolic_shape_infer.py")
        spec = importlib.util.spec_from_file_location("passctl_ort_symbolic_shape_infer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        # Its warnings ("Only support models of onnx opset 7 and above", "unsupported broadcast")
        # are about its own best-effort inference, not the user's model: the verifier reports
        # what matters as its own diagnostics. Shown with PASSCTL_LOG=debug.
        if not logger.isEnabledFor(logging.DEBUG):
            logging.getLogger(spec.name).setLevel(logging.ERROR)
        _SYMBOLIC = module.SymbolicShapeInference
    return _SYMBOLIC


_SYMBOLIC = None


def _infer_model(proto: onnx.ModelProto, symbolic: bool) -> Optional[onnx.ModelProto]:
    try:
        if symbolic:
            opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
            if opset < 7:  # ORT's symbolic inference supports opset 7 and above only
                logger.info("verifier: symbolic shape inference skipped (opset %d < 7)", opset)
                return None
            SymbolicShapeInference = _symbolic_shape_inference()
            copy = onnx.ModelProto()
            copy.CopyFrom(proto)
            # NOTE: on incomplete inference ORT saves "sym_shape_infer_temp.onnx" (+ a data file) into
            # the current folder; run it in a throwaway folder so no file appears next to the user's.
            cwd = os.getcwd()
            with tempfile.TemporaryDirectory(prefix="passctl-symshape-") as scratch:
                os.chdir(scratch)
                try:
                    out = SymbolicShapeInference.infer_shapes(copy, auto_merge=True)
                finally:
                    os.chdir(cwd)
        else:
            out = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as e:  # noqa: BLE001 - inference is best effort here
        logger.info("verifier: %s shape inference failed: %s", "symbolic" if symbolic else "ONNX", e)
        return None
    return out


def _output_types(out: onnx.ModelProto) -> Dict[int, Tuple[int, Optional[tuple]]]:
    result = {}
    for i, o in enumerate(out.graph.output):
        if not o.type.HasField("tensor_type"):
            continue
        tt = o.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        result[i] = (tt.elem_type, dims)
    return result


def _reshape_rank(inferred: onnx.ModelProto, i: int) -> Optional[int]:
    """Rank of output ``i`` when a Reshape produces it and its ``shape`` input has a known length.

    ONNX's Reshape inference gives up when ``shape`` is computed; the rank is still the length of
    ``shape`` (ONNX operator spec, Reshape: "the output tensor has the shape given by ``shape``").
    """
    name = inferred.graph.output[i].name
    producer = next((n for n in inferred.graph.node if name in n.output), None)
    if producer is None or producer.op_type != "Reshape" or producer.domain not in ("", "ai.onnx"):
        return None
    if len(producer.input) < 2:
        return None
    shape_name = producer.input[1]
    for init in inferred.graph.initializer:
        if init.name == shape_name:
            return int(init.dims[0]) if len(init.dims) == 1 else None
    for vi in inferred.graph.value_info:
        if vi.name == shape_name and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == 1 and dims[0].HasField("dim_value"):
                return int(dims[0].dim_value)
    return None


def _dims(t: TensorType) -> Optional[tuple]:
    return None if t.shape is None else tuple(d if isinstance(d, int) else None for d in t.shape)


def _disagreement(t: TensorType, elem: int, dims: Optional[tuple]) -> str:
    if elem and int(t.dtype) and elem != int(t.dtype):
        return "element type differs"
    mine = _dims(t)
    if mine is None or dims is None:
        return ""
    if len(mine) != len(dims):
        return f"rank {len(mine)} vs {len(dims)}"
    for k, (a, b) in enumerate(zip(mine, dims)):
        if a is not None and b is not None and a != b:
            return f"dim {k}: {a} vs {b}"
    return ""


def _fmt(elem: int, dims: Optional[tuple]) -> str:
    name = onnx.TensorProto.DataType.Name(elem).lower() if elem else "?"
    shape = "?" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
    return f"{name}{shape}"
