"""What TensorRT's ONNX parser accepts: opset range, operators, and the restrictions passctl checks."""

from __future__ import annotations

from typing import Iterator, List, Optional

import numpy as np

from passctl.ir import Model, Node
from passctl.ir.errors import UserError

#: The TensorRT release whose ONNX parser support matrix the tables below transcribe
#: (onnx-tensorrt ``docs/operators.md``: "TensorRT 10.15 supports operators in the inclusive range of
#: opset 9 to opset 24").
TENSORRT_VERSION = "10.15"
MIN_OPSET, MAX_OPSET = 9, 24

#: Default-domain operators marked "N" (not supported) in that matrix. Every other operator of the
#: ONNX default domain up to opset 24 parses; ops of other domains (``com.microsoft``, ``passctl``)
#: only through a TensorRT plugin of the same name, which passctl does not provide.
UNSUPPORTED_OPS = frozenset({
    "AffineGrid", "Bernoulli", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
    "Col2Im", "CenterCropPad", "Compress", "ConcatFromSequence", "ConvInteger", "DFT", "Det",
    "DynamicQuantizeLinear", "ImageDecoder", "MatMulInteger", "MaxRoiPool", "MaxUnpool",
    "MelWeightMatrix", "Multinomial", "NegativeLogLikelihoodLoss", "Optional",
    "OptionalGetElement", "OptionalHasElement", "QLinearConv", "QLinearMatMul", "RegexFullMatch",
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
    "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss", "SplitToSequence", "StringConcat",
    "StringNormalizer", "StringSplit", "TfIdfVectorizer", "Unique",
})

#: Reduce ops whose ``axes`` (an input from opset 18, 13 for ReduceSum) must be an initializer.
_REDUCE_OPS = frozenset({"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
                         "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"})
_RESIZE_MODES = frozenset({"nearest", "linear"})
_RESIZE_COORDINATES = frozenset({"half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn",
                                 "asymmetric", "align_corners"})
#: TopK's K must be below this (matrix: "`K` input must be less than 3840").
MAX_TOPK = 3840


def _const(node: Node, index: int) -> Optional[np.ndarray]:
    value = node.inputs[index] if index < len(node.inputs) else None
    return None if value is None or value.const is None else value.const.numpy()


def _restriction(node: Node) -> Optional[str]:
    """Why TensorRT's parser refuses ``node`` under the matrix's restrictions column, or None."""
    op = node.op_type
    if op in _REDUCE_OPS and len(node.inputs) > 1 and node.inputs[1] is not None \
            and node.inputs[1].const is None:
        return "its axes input must be an initializer"
    if op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1].uses():
        return "the Indices output is not supported"
    if op == "LayerNormalization" and any(o.uses() or o.is_graph_output()
                                          for o in node.outputs[1:]):
        return "only the first output Y is supported"
    if op == "TopK":
        k = _const(node, 1)
        if k is None:
            return "K must be an initializer"
        if int(np.asarray(k).reshape(-1)[0]) >= MAX_TOPK:
            return f"K must be less than {MAX_TOPK}"
        if node.attr("sorted", 1) != 1:
            return "sorted must be 1"
    if op == "Resize":
        mode = node.attr("mode", "nearest")
        coords = node.attr("coordinate_transformation_mode", "half_pixel")
        if mode not in _RESIZE_MODES:
            return f"mode '{mode}' is not supported (nearest, linear)"
        if coords not in _RESIZE_COORDINATES:
            return f"coordinate_transformation_mode '{coords}' is not supported"
        if node.attr("antialias", 0):
            return "antialias is not supported"
        if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
            return "keep_aspect_ratio_policy must be stretch"
    if op in ("QuantizeLinear", "DequantizeLinear"):
        zero_point = _const(node, 2)
        if zero_point is not None and np.any(zero_point.astype(np.float64) != 0):
            return "the zero point must be 0 (symmetric quantization)"
        why = _qdq_restriction(node)
        if why is not None:
            return why
    if op == "ScatterND" and node.attr("reduction", "none") != "none":
        return "reduction other than none is not supported"
    return None


#: Element types of DequantizeLinear's quantized input the parser takes (TensorRT's Dequantize
#: operator: "T1: int8, fp8, int4"; UINT8 only with the DLA flag, onnx-tensorrt
#: ``QuantDequantLinearHelper`` ``checkNotInvalidType(..., {"UINT8"})``).
_DQ_INPUT_TYPES = frozenset({"INT8", "INT4", "FLOAT8E4M3FN"})
#: INT4 block sizes ("The supported block sizes are {64, 128}": TensorRT developer guide,
#: Quantization Schemes).
INT4_BLOCKS = (64, 128)


def _qdq_restriction(node: Node) -> Optional[str]:
    """Q/DQ restrictions of TensorRT 10 (onnx-tensorrt ``QuantDequantLinearHelper`` in
    onnxOpImporters.cpp; TensorRT's Dequantize / Quantize operators and Quantization Schemes
    pages) decided from the graph: scales > 0 when they are initializers; DequantizeLinear's
    data int8 / int4 / fp8 (no uint8 / uint4); a 1-D scale of ``dims[axis]`` entries; a blocked
    scale (the input's rank) only for int4 data, on a 2-D input, one blocked axis among the last
    two, ``block_size`` 64 or 128 that divides that axis exactly (the parser infers the block
    from the shapes); an even number of 4-bit elements."""
    scale = _const(node, 1)
    if scale is not None and not np.all(scale.astype(np.float64) > 0):
        return "every scale must be > 0 (Scale coefficients must all be positive)"
    x = node.inputs[0] if node.inputs else None
    dtype = x.dtype if x is not None else None
    name = getattr(dtype, "name", None)
    dq = node.op_type == "DequantizeLinear"
    if dq and name is not None and name not in _DQ_INPUT_TYPES:
        return f"the quantized data is int8, int4 or fp8 (not {name.lower()})"
    shape = None if x is None or x.shape is None else x.shape
    dims = None if shape is None or shape.rank is None else tuple(shape.dims)
    scale_v = node.inputs[1] if len(node.inputs) > 1 else None
    scale_dims = (None if scale_v is None or scale_v.shape is None or scale_v.shape.rank is None
                  else tuple(scale_v.shape.dims))
    block = node.attr("block_size", 0)
    rank = None if dims is None else len(dims)
    if dims is not None and name in ("INT4", "UINT4") and all(isinstance(d, int) for d in dims) \
            and int(np.prod(dims)) % 2:
        return "a 4-bit tensor has an even number of elements"
    blocked = block or (scale_dims is not None and rank is not None and len(scale_dims) == rank
                        and rank > 1 and int(np.prod(scale_dims)) > 1)
    if not blocked:
        if scale_dims is not None and len(scale_dims) == 1 and dims is not None \
                and scale_dims[0] != 1:
            axis = node.attr("axis", 1)
            axis = axis + rank if axis < 0 else axis
            if 0 <= axis < rank and isinstance(dims[axis], int) and dims[axis] != scale_dims[0]:
                return (f"a per-channel scale has dims[axis] = {dims[axis]} entries "
                        f"(it has {scale_dims[0]})")
        return None
    if dq and name is not None and name != "INT4":
        return f"block quantization is for int4 data only (this is {name.lower()})"
    if rank is not None and rank != 2:
        return f"a blocked DequantizeLinear's input is 2-D (it is {rank}-D)"
    if block not in INT4_BLOCKS:
        return f"block_size is 64 or 128 (it is {block})"
    axis = node.attr("axis", 1)
    axis = axis + 2 if axis < 0 else axis
    if dims is not None and isinstance(dims[axis], int) and dims[axis] % block:
        return (f"the blocked axis ({dims[axis]}) is a multiple of block_size {block} (the "
                "parser infers the block from the shapes)")
    return None


def _problems(model: Model) -> Iterator[str]:
    for node in model.graph.all_nodes():
        where = f"node '{node.name or '(unnamed)'}' ({node.qualified_op}"
        origin = [name for name in node.provenance if name != node.name]
        where += f", from {', '.join(origin)})" if origin else ")"
        if node.domain not in ("", "ai.onnx"):
            yield (f"{where}: TensorRT's ONNX parser has no '{node.domain}' operators (only through "
                   "a plugin); run the pipeline with --emit tensorrt so it lowers passctl's fused "
                   "ops to standard ONNX")
        elif node.op_type in UNSUPPORTED_OPS:
            yield f"{where}: {node.op_type} is not supported by TensorRT {TENSORRT_VERSION}'s ONNX parser"
        else:
            why = _restriction(node)
            if why is not None:
                yield f"{where}: TensorRT's ONNX parser requires that {why}"


def check_support(model: Model, source: str = "--emit tensorrt") -> List[str]:
    """Check ``model`` against TensorRT's ONNX parser support matrix (TensorRT
    :data:`TENSORRT_VERSION`, onnx-tensorrt ``docs/operators.md``) before anything is written.

    Checked: the default-domain opset is within [:data:`MIN_OPSET`, :data:`MAX_OPSET`]; no operator
    of another domain; no operator the matrix marks unsupported; the matrix's restrictions that
    the graph alone decides (Reduce* axes and TopK's K initializers, MaxPool's Indices and
    LayerNormalization's extra outputs unused, Resize modes, zero Q/DQ zero points and positive
    scales, DequantizeLinear's data types and per-channel / blocked int4 scale shapes
    (:func:`_qdq_restriction`), ScatterND without reduction). Restrictions that depend on run-time values are left to the parser.

    Args:
        model: the compiled IR (not modified).
        source: what starts the messages.

    Returns:
        warnings (float64 tensors, which TensorRT casts down to float32); empty when none.

    Raises:
        UserError: the first problem, one line naming the node, its op and provenance, with the
            count of further problems.
    """
    opset = model.opset
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UserError(f"{source}: opset {opset} is outside TensorRT {TENSORRT_VERSION}'s ONNX "
                        f"parser range {MIN_OPSET}..{MAX_OPSET}; convert the model with "
                        f"onnx.version_converter.convert_version(model, {min(max(opset, MIN_OPSET), MAX_OPSET)})")
    problems = list(_problems(model))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{source}: {problems[0]}{more}")
    from passctl.ir import DataType

    doubles = sorted({v.name for n in model.graph.all_nodes() for v in n.outputs
                      if v.dtype == DataType.DOUBLE})
    if doubles:
        return [f"{source}: {len(doubles)} float64 tensors (first '{doubles[0]}'): TensorRT casts "
                "float64 down to float32, clamping to +-FLT_MAX"]
    return []


__all__ = ["INT4_BLOCKS", "MAX_OPSET", "MIN_OPSET", "TENSORRT_VERSION", "UNSUPPORTED_OPS",
           "check_support"]
