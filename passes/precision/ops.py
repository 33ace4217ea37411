"""Which ONNX ops can run in fp16/bf16, which of their inputs follow the data type, and which are exact."""

from __future__ import annotations

import functools
from typing import FrozenSet, Optional, Tuple

import onnx.defs

from passctl.ir import DataType, Node

ALL = None
"""Marker: every input follows the op's float type ``T``."""

# op_type -> input indices whose element type is the op's float type T (ONNX operator schemas, opset
# 13-21); ALL means every input. Whether T admits fp16 / bf16 at the model's opset is the schema's
# word (schema_refusal: Conv has bfloat16 only from Conv-22, MaxPool from MaxPool-22, ...). Outputs of these ops that are float32 follow T too. An op missing
# here has no low-precision form in passctl (it stays float32): ops whose output type comes from an
# attribute (Cast, ConstantOfShape, RandomNormal, EyeLike), ops with subgraphs, custom domains.
COMPUTE_OPS = {
    # elementwise, rounding happens in the op
    "Add": ALL, "Sub": ALL, "Mul": ALL, "Div": ALL, "Pow": ALL, "Sqrt": ALL, "Reciprocal": ALL,
    "Exp": ALL, "Log": ALL, "Erf": ALL, "Tanh": ALL, "Sigmoid": ALL, "Softplus": ALL, "Gelu": ALL,
    "HardSigmoid": ALL, "HardSwish": ALL, "Elu": ALL, "Selu": ALL, "LeakyRelu": ALL, "Mish": ALL,
    "Sin": ALL, "Cos": ALL, "Softsign": ALL, "Sum": ALL, "Mean": ALL, "PRelu": ALL,
    # contractions and normalizations
    "MatMul": ALL, "Gemm": ALL, "Conv": ALL, "ConvTranspose": ALL, "BatchNormalization": ALL,
    "InstanceNormalization": ALL, "LayerNormalization": ALL, "AveragePool": ALL,
    "GlobalAveragePool": ALL, "Softmax": ALL, "LogSoftmax": ALL, "RMSNormalization": ALL,
    # ONNX Runtime registers SimplifiedLayerNormalization (RMSNorm) in the default domain; its
    # statistics stay float32 (stash_type=1), as LayerNormalization's
    "SimplifiedLayerNormalization": ALL,
    # reductions that add (ReduceMax/Min are exact, below)
    "ReduceMean": (0,), "ReduceSum": (0,), "ReduceProd": (0,), "ReduceSumSquare": (0,),
    "ReduceL1": (0,), "ReduceL2": (0,), "ReduceLogSum": (0,), "ReduceLogSumExp": (0,),
}

# ONNX Runtime contrib ops (domain com.microsoft) that ``fuse`` + ``lower-onnxruntime`` emit, with
# fp16 kernels in ORT's CUDA EP (contrib_ops/cuda); normalizations accumulate in float32 inside.
CONTRIB_COMPUTE_OPS = {
    "SkipLayerNormalization": ALL, "SkipSimplifiedLayerNormalization": ALL, "BiasGelu": ALL, "FastGelu": ALL, "Gelu": ALL,
    "QuickGelu": ALL, "BiasAdd": ALL, "FusedMatMul": ALL, "FusedConv": ALL,
}

# Outputs that follow T when an op has others of a fixed type (LayerNormalization-17's Mean and
# InvStdDev are float32 with the default stash_type; the contrib norms' mean / inv_std_var likewise).
TYPED_OUTPUTS = {"LayerNormalization": (0,), "SkipLayerNormalization": (0, 3),
                 "SkipSimplifiedLayerNormalization": (0, 3), "SimplifiedLayerNormalization": (0,)}

# Ops whose result is exact in any float type once their inputs are rounded (data movement,
# selection, sign): they "follow" their producers instead of being searched (no rounding of their own).
EXACT_OPS = {
    "Reshape": (0,), "Transpose": ALL, "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": ALL,
    "Concat": ALL, "Split": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,),
    "GatherND": (0,), "Expand": (0,), "Tile": (0,), "Identity": ALL, "Where": (1, 2), "Pad": (0, 2),
    "DepthToSpace": ALL, "SpaceToDepth": ALL, "Relu": ALL, "Neg": ALL, "Abs": ALL, "Max": ALL,
    "Min": ALL, "ReduceMax": (0,), "ReduceMin": (0,), "MaxPool": (0,), "GlobalMaxPool": ALL,
    "Clip": ALL, "Floor": ALL, "Ceil": ALL, "Round": ALL, "Sign": ALL,
}

# Inputs that take any element type, so a low-precision value needs no Cast to feed them.
ANY_TYPE_INPUTS = {"Shape": (0,), "Size": (0,), "Cast": (0,)}

# Reductions whose rounding error grows with the number of elements added (rule long-reduction).
ADDING_REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceProd", "ReduceSumSquare", "ReduceL1",
                               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"})

_STANDARD = ("", "ai.onnx")
CONTRIB = "com.microsoft"


def typed_inputs(node: Node) -> Optional[Tuple[int, ...]]:
    """Input indices of ``node`` that follow its float type T, or None when the op has no
    low-precision form here (unknown op, custom domain, subgraphs)."""
    if node.subgraphs():
        return None
    if node.domain == CONTRIB:
        table = CONTRIB_COMPUTE_OPS
    elif node.domain in _STANDARD:
        table = COMPUTE_OPS if node.op_type in COMPUTE_OPS else EXACT_OPS
    else:
        return None
    if node.op_type not in table:
        return None
    slots = table[node.op_type]
    if node.op_type == "Pow":  # Pow-15: the exponent has its own type T1 (float or integer)
        exponent = node.inputs[1] if len(node.inputs) > 1 else None
        return (0, 1) if exponent is not None and exponent.dtype == DataType.FLOAT else (0,)
    return tuple(range(len(node.inputs))) if slots is ALL else slots


def typed_outputs(node: Node) -> Tuple[int, ...]:
    """Output indices of ``node`` that follow its float type T (all, except for :data:`TYPED_OUTPUTS`)."""
    slots = TYPED_OUTPUTS.get(node.op_type, tuple(range(len(node.outputs))))
    return tuple(i for i in slots if i < len(node.outputs))


def is_compute(node: Node) -> bool:
    """Whether ``node`` is an op that rounds (standard COMPUTE_OPS or a contrib op listed here)."""
    if node.domain == CONTRIB:
        return node.op_type in CONTRIB_COMPUTE_OPS
    return node.domain in _STANDARD and node.op_type in COMPUTE_OPS


def float_inputs(node: Node) -> Tuple[int, ...]:
    """The T-typed input indices of ``node`` that hold float32 values now (empty if none)."""
    slots = typed_inputs(node) or ()
    return tuple(i for i in slots if i < len(node.inputs) and node.inputs[i] is not None
                 and node.inputs[i].dtype == DataType.FLOAT)


def is_exact(node: Node) -> bool:
    """Whether ``node`` is a data-movement or selection op (its low-precision result is exact)."""
    return node.domain in _STANDARD and node.op_type in EXACT_OPS


def has_float32(node: Node) -> bool:
    """Whether any input or output of ``node`` is a float32 tensor."""
    return any(v is not None and v.dtype == DataType.FLOAT for v in (*node.inputs, *node.outputs))


def convertible(node: Node) -> bool:
    """Whether ``node`` can run in low precision: a known op whose T-typed values are all float32
    (an op already in fp16, or in float64, is left alone)."""
    slots = typed_inputs(node)
    if slots is None:
        return False
    typed = [node.inputs[i] for i in slots if i < len(node.inputs) and node.inputs[i] is not None]
    if not typed or any(v.dtype != DataType.FLOAT for v in typed):
        return False
    return all(node.outputs[i].dtype == DataType.FLOAT for i in typed_outputs(node))


_TYPE_STR = {DataType.FLOAT16: "tensor(float16)", DataType.BFLOAT16: "tensor(bfloat16)"}


def _allowed(schema: onnx.defs.OpSchema, formal: onnx.defs.OpSchema.FormalParameter) -> FrozenSet[str]:
    """Type strings a formal input/output of ``schema`` admits (its constraint's, or a fixed type)."""
    for c in schema.type_constraints:
        if c.type_param_str == formal.type_str:
            return frozenset(c.allowed_type_strs)
    return frozenset({formal.type_str})


def _formal(params, index: int):
    """The formal parameter of actual position ``index`` (a variadic last one repeats), or None."""
    if index < len(params):
        return params[index]
    last = params[-1] if params else None
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return last if last is not None and last.option == variadic else None


def _schema_admits(op_type: str, version: int, type_str: str, ins: Tuple[int, ...],
                   outs: Tuple[int, ...]) -> Optional[onnx.defs.OpSchema]:
    """The ONNX schema of ``op_type`` at default-domain opset ``version`` when every input in ``ins``
    and output in ``outs`` admits ``type_str``, else None (also None when no schema exists)."""
    try:
        schema = onnx.defs.get_schema(op_type, version, "")
    except onnx.defs.SchemaError:
        return None
    for params, slots in ((schema.inputs, ins), (schema.outputs, outs)):
        for i in slots:
            formal = _formal(params, i)
            if formal is not None and type_str not in _allowed(schema, formal):
                return None
    return schema


@functools.lru_cache(maxsize=None)
def _refusal(op_type: str, opset: int, low: int, ins: Tuple[int, ...],
             outs: Tuple[int, ...]) -> Optional[str]:
    type_str = _TYPE_STR[DataType(low)]
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None  # no ONNX schema (ONNX Runtime registers it in the default domain): as before
    if _schema_admits(op_type, opset, type_str, ins, outs) is not None:
        return None
    name = type_str[len("tensor("):-1]
    later = next((v for v in range(opset + 1, onnx.defs.onnx_opset_version() + 1)
                  if _schema_admits(op_type, v, type_str, ins, outs) is not None), None)
    when = (f"from opset {later}" if later is not None
            else f"in no opset up to {onnx.defs.onnx_opset_version()}")
    return f"{op_type}-{schema.since_version} has no {name} ({when})"


def schema_refusal(node: Node, opset: int, low: DataType) -> Optional[str]:
    """Why ``node`` cannot run in ``low`` at default-domain ``opset`` per its ONNX operator schema, or
    None when it can.

    The inputs :func:`typed_inputs` names and the outputs :func:`typed_outputs` names (the values
    ``amp`` retypes) must each admit ``tensor(float16)`` / ``tensor(bfloat16)`` in the type
    constraint of their formal parameter in ``onnx.defs.get_schema(op_type, opset, "")`` (e.g. Conv-11
    admits float16 but not bfloat16; Conv-22 adds bfloat16). Nodes of other domains (ONNX Runtime's
    com.microsoft contrib ops, whose schemas come from onnxruntime) and default-domain ops without an
    ONNX schema (ONNX Runtime's own SimplifiedLayerNormalization) are not judged here: None.

    Args:
        node: A node of the main graph, element types known.
        opset: The model's default-domain opset version (``Model.opset``).
        low: DataType.FLOAT16 or DataType.BFLOAT16.

    Returns:
        None, or a one-line reason such as ``"Conv-11 has no bfloat16 (from opset 22)"``.
    """
    if node.domain not in _STANDARD:
        return None
    ins = typed_inputs(node)
    if ins is None:
        return None
    ins = tuple(i for i in ins if i < len(node.inputs) and node.inputs[i] is not None)
    return _refusal(node.op_type, int(opset), int(low), ins, typed_outputs(node))
