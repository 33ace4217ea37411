"""A float64 evaluation of a float32 ONNX model: the "exact" answer that tells an fp32 rounding
difference from a wrong result.

Two float32 evaluations of the same math (ONNX Runtime on the original and on a rewritten graph,
or at two optimization levels) differ by rounding. Where an output is ill-conditioned (e.g. a
LayerNorm over rows that are equal in exact arithmetic: ``x - mean(x)`` is pure rounding noise,
then divided by ``sqrt(var + eps)`` with ``var`` about 0, so the noise is amplified ``1/sqrt(eps)``
times), that difference alone can exceed the 1e-5 relative bound of a float32 rewrite, although
neither side is wrong. :func:`float64_outputs` runs the same model with every float32 tensor
widened to float64; :func:`rounding_excess` then measures how much further an fp32 answer is from
it than ONNX Runtime's own fp32 run of the original is (the error the original itself carries).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

logger = logging.getLogger(__name__)

__all__: Sequence[str] = ("float64_model", "float64_outputs", "rounding_excess")

_F32, _F64 = TensorProto.FLOAT, TensorProto.DOUBLE
# ops whose output type is set by an attribute other than Cast's ``to`` (widened below) or that
# hold float32-only parameters: their float64 form is not the same model
_UNWIDENABLE = {"DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                "QLinearMatMul", "MatMulInteger", "ConvInteger", "RandomNormal", "RandomUniform",
                "RandomNormalLike", "RandomUniformLike", "Multinomial", "EyeLike", "Bernoulli"}


def _widen_tensor(t: TensorProto) -> TensorProto:
    if t.data_type != _F32:
        return t
    return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name)


def float64_model(model: onnx.ModelProto) -> Optional[onnx.ModelProto]:
    """A copy of ``model`` with every float32 tensor float64: initializers, ``Constant`` and
    ``ConstantOfShape`` values, ``Cast``/``CastLike`` targets, graph inputs, outputs and
    value_info. None when the model has a node whose float64 form is not the same model
    (subgraph attributes, quantization ops, random ops, non-default domains).

    Args:
        model: an ONNX model whose weights are in memory (external data loaded).
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for node in g.node:
        if node.domain not in ("", "ai.onnx") or node.op_type in _UNWIDENABLE:
            return None
        for a in node.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                return None
            if a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(_widen_tensor(a.t))
            if node.op_type == "Cast" and a.name == "to" and a.i == _F32:
                a.i = _F64
    for i, t in enumerate(g.initializer):
        if t.data_type == _F32:
            g.initializer[i].CopyFrom(_widen_tensor(t))
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == _F32:
            v.type.tensor_type.elem_type = _F64
    return m


def float64_outputs(model: Union[str, onnx.ModelProto], inputs: Mapping[str, np.ndarray],
                    check: Optional[Mapping[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The outputs of ``model`` evaluated in float64 on ``inputs`` (float32 inputs widened),
    ``{name: array}`` in graph-output order; None when no trustworthy float64 evaluation exists.

    First ONNX Runtime's CPU provider (optimizations off) on :func:`float64_model`: the same
    kernels as its float32 run, templated on the type, so the two differ by rounding only. Where
    ONNX Runtime has no float64 kernel for an op, ``onnx.reference`` evaluates it, but only if its
    float32 run agrees with ``check`` (ONNX Runtime's float32 outputs of the same model, same
    inputs) within 1e-5 relative of each output's max magnitude: where the two implement the op
    differently (e.g. LpNormalization), the float64 answer would not be the same math.

    Args:
        model: a path of an ``.onnx`` file or a ModelProto with its weights in memory.
        inputs: ``{input name: array}`` as for the float32 model.
        check: ONNX Runtime's float32 outputs of ``model`` on ``inputs`` (needed for the
            ``onnx.reference`` fallback; without it that fallback is not taken).
    """
    proto = onnx.load(model) if isinstance(model, str) else model
    wide = float64_model(proto)
    if wide is None:
        return None
    feeds = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == np.float32
                 else v) for k, v in inputs.items()}
    names = [o.name for o in wide.graph.output]
    try:
        from passctl.support.check import quiet_stdout, run_onnxruntime

        with quiet_stdout():
            return run_onnxruntime(wide, feeds)
    except Exception as e:  # noqa: BLE001  (no float64 kernel for some op: try onnx.reference)
        logger.debug("float64 ONNX Runtime run failed: %s", e)
    if check is None:
        return None
    try:
        from onnx.reference import ReferenceEvaluator

        narrow = ReferenceEvaluator(proto).run(None, dict(inputs))
        for name, a in zip(names, narrow):
            r = check.get(name)
            if isinstance(r, np.ndarray) and r.dtype.kind == "f":
                fin = np.isfinite(r) & np.isfinite(a)
                if fin.any() and float(np.abs(r[fin] - a[fin]).max()) > 1e-5 * max(
                        float(np.abs(r[fin]).max()), 1e-30):
                    return None
        return dict(zip(names, ReferenceEvaluator(wide).run(None, feeds)))
    except Exception as e:  # noqa: BLE001
        logger.debug("float64 onnx.reference run failed: %s", e)
        return None


def rounding_excess(ref: np.ndarray, got: np.ndarray, exact: np.ndarray) -> float:
    """How much further ``got`` (float32) is from the float64 answer ``exact`` than ``ref``
    (ONNX Runtime's float32 run of the original) is, as a fraction of ``max |exact|``, over the
    positions where all three are finite:

        (max |got - exact| - max |ref - exact|) / max |exact|

    An fp32 rewrite is within the project's rule (1e-5 relative) when this is at most 1e-5:
    the rewrite adds no more than 1e-5 relative to the error the original carries in float32.
    Where the output is well conditioned, ``max |ref - exact|`` is a few ulps and this is the
    plain relative error against the exact answer; where it is not, the original's own error
    is not counted against the rewrite.
    """
    fin = np.isfinite(ref) & np.isfinite(got) & np.isfinite(exact)
    if not fin.any():
        return 0.0
    e = exact[fin].astype(np.float64)
    scale = max(float(np.abs(e).max()), 1e-30)
    return (float(np.abs(got[fin].astype(np.float64) - e).max())
            - float(np.abs(ref[fin].astype(np.float64) - e).max())) / scale
