"""fuse-conv-bn: fold inference BatchNormalization into the Conv / ConvTranspose that feeds it."""

from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

from passctl.ir import Graph, Model, Node, Value
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array, is_standard_op
from passctl.passes.fusion.bn_math import fold_bn_into_conv_weights
from passctl.passes.registry import register_pass

logger = logging.getLogger(__name__)

_CONVS = ("Conv", "ConvTranspose")


@register_pass
class FuseConvBatchNorm(Pass):
    """Fold ``BatchNormalization`` into a preceding ``Conv`` or ``ConvTranspose``.

    Rules (the checks, in order; the first that fails leaves the pair alone):
      1. The BatchNormalization is the inference form: ``training_mode`` 0, ``spatial`` 1 (old
         opsets), and any outputs besides ``Y`` unused.
      2. Its input is produced by a default-domain Conv / ConvTranspose of the same graph, whose
         output has no other consumer and is no graph output.
      3. The convolution weight and bias (if any) and the BN's scale, B, mean and var are
         constants (initializers or Constant nodes; run fold-constants first to lift Constant
         weights), with a floating-point weight and channel counts that agree.
    Rewrite: a new convolution with the same attributes reads a NEW weight and bias initializer,
    ``W' = W * s`` and ``b' = (b - mean) * s + B`` with ``s = scale / sqrt(var + epsilon)`` per
    output channel, using each BN's own epsilon (math in
    :func:`passctl.passes.fusion.bn_math.fold_bn_into_conv_weights`, group-aware for
    ConvTranspose). The old weight is never changed, so another node that uses it keeps working;
    dce removes it when nothing uses it any more. The BN's output name is kept when it is a graph
    output; the new node's provenance is the union of the Conv's and the BN's.

    Statistics: ``fused`` (pairs folded).
    """

    name = "fuse-conv-bn"
    summary = "Fold inference BatchNormalization into the preceding Conv or ConvTranspose"

    def run(self, model: Model) -> PassResult:
        stats = {"fused": 0}
        _fuse_graph(model.graph, stats)
        return PassResult(stats["fused"] > 0, stats)


def _fuse_graph(graph: Graph, stats: Dict[str, int]) -> None:
    for node in graph:
        for sub in node.subgraphs():
            _fuse_graph(sub, stats)
        if node.op_type != "BatchNormalization" or not is_standard_op(node):
            continue
        match, reason = match_conv_bn(node)
        if match is None:
            logger.debug("fuse-conv-bn: %r not folded: %s", node, reason)
            continue
        _rewrite(graph, node, *match)
        stats["fused"] += 1


def match_conv_bn(bn: Node) -> Tuple[Optional[tuple], str]:
    """Check whether ``bn`` can be folded into its producer (never mutates).

    Returns:
        ``((conv, arrays), "")`` on success, where ``arrays`` holds the constant weight, bias (or
        None), scale, B, mean and var; else ``(None, reason)`` saying which check failed.
    """
    if bn.attr("training_mode", 0):
        return None, "BatchNormalization is in training mode"
    if bn.attr("spatial", 1) != 1:
        return None, "BatchNormalization has spatial=0 (per-activation statistics)"
    if any(v.uses() or v.is_graph_output() for v in bn.outputs[1:]):
        return None, "BatchNormalization's running mean/var outputs are used"
    if len(bn.inputs) != 5 or any(v is None for v in bn.inputs):
        return None, "BatchNormalization does not have its 5 inputs"
    x = bn.inputs[0]
    conv = x.producer
    if conv is None or conv.op_type not in _CONVS or not is_standard_op(conv):
        return None, "input is not produced by a Conv or ConvTranspose"
    if conv.graph is not bn.graph:
        return None, "the convolution is in another graph scope"
    if len(x.uses()) != 1 or x.is_graph_output():
        return None, f"{conv.op_type} output '{x.name}' has other consumers or is a graph output"
    weight = constant_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is None:
        return None, f"{conv.op_type} weight is not a constant"
    if weight.dtype.kind != "f" and weight.dtype.name != "bfloat16":
        return None, f"{conv.op_type} weight has non-float element type {weight.dtype}"
    bias = None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        bias = constant_array(conv.inputs[2])
        if bias is None:
            return None, f"{conv.op_type} bias is not a constant"
    params = [constant_array(v) for v in bn.inputs[1:]]
    if any(p is None for p in params):
        return None, "BatchNormalization scale/B/mean/var are not all constants"
    group = conv.attr("group", 1)
    transpose = conv.op_type == "ConvTranspose"
    c_out = weight.shape[1] * group if transpose else weight.shape[0]
    if any(p.size != c_out for p in params) or (bias is not None and bias.size != c_out):
        return None, f"channel counts disagree ({conv.op_type} has {c_out} output channels)"
    return (conv, (weight, bias, *params)), ""


def _rewrite(graph: Graph, bn: Node, conv: Node, arrays: tuple) -> None:
    weight, bias, scale, b, mean, var = arrays
    transpose = conv.op_type == "ConvTranspose"
    new_w, new_b = fold_bn_into_conv_weights(weight, bias, scale, b, mean, var,
                                             float(bn.attr("epsilon", 1e-5)),
                                             transpose=transpose, group=conv.attr("group", 1))
    w_value = graph.add_constant(new_w, name=f"{conv.inputs[1].name}_bn")
    b_value = graph.add_constant(new_b, name=f"{bn.outputs[0].name}_bias")
    y = bn.outputs[0]
    out = Value(graph.fresh_name(f"{y.name}_fused"), type=y.type)
    fused = Node(conv.domain, conv.op_type, [conv.inputs[0], w_value, b_value],
                 attributes=list(conv.attributes.values()), outputs=[out],
                 name=graph.fresh_name(conv.name or conv.op_type))
    graph.replace_nodes([conv, bn], [fused], [y], [out])
