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
    if op == "ScatterND" and node.attr("reduction", "none") != "none":
        return "reduction other than none is not supported"
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
    LayerNormalization's extra outputs unused, Resize modes, zero Q/DQ zero points, ScatterND
    without reduction). Restrictions that depend on run-time values are left to the parser.

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


__all__ = ["MAX_OPSET", "MIN_OPSET", "TENSORRT_VERSION", "UNSUPPORTED_OPS", "check_support"]
