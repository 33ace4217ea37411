"""fuse-skip-rmsnorm: residual Add + passctl::RMSNorm -> passctl::SkipRMSNorm, keeping the sum as output 2."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

from passctl.ir import Model, Node, Value
from passctl.passes.base import Pass, PassResult
from passctl.dialect.canonical import DOMAIN, VERSION, ensure_opset, optional_input
from passctl.passes.fusion.layernorm import _same_shape
from passctl.passes.registry import register_pass
from passctl.passes.rewrite import MatchResult
from passctl.passes.rewrite.pattern import node_label
from passctl.passes.rewrite.types import ReplacementError, checked_replace, discard_nodes

logger = logging.getLogger(__name__)


def check_skip_rmsnorm(norm: Node) -> Tuple[Optional[Node], MatchResult]:
    """Whether ``norm`` (a ``passctl::RMSNorm``) and the Add producing its input fuse.

    The Add's result may have other consumers or be a graph output (a pre-norm residual stream
    reads it again in the next block): the fused op then writes it as its second output.

    Args:
        norm: a node; anything but ``passctl::RMSNorm`` fails.

    Returns:
        ``(add, result)``: the residual Add (None when there is none) and a :class:`MatchResult`
        whose ``reason`` says why the pair does not fuse, e.g. ``SkipRMSNorm: shapes of 'a'
        (2x1x8) and 'r' (2x4x8) differ: the Add broadcasts, it is no residual connection``.
    """
    if norm.domain != DOMAIN or norm.op_type != "RMSNorm":
        return None, MatchResult().fail(f"{node_label(norm)} is not passctl::RMSNorm", norm)
    add = norm.inputs[0].producer if norm.inputs and norm.inputs[0] is not None else None
    if add is None or add.domain not in ("", "ai.onnx") or add.op_type != "Add":
        return None, MatchResult().fail(f"SkipRMSNorm: the input of {node_label(norm)} is not made "
                                        "by an Add", norm)
    if add.graph is not norm.graph or len(add.inputs) != 2 or any(v is None for v in add.inputs):
        return add, MatchResult().fail(f"SkipRMSNorm: {node_label(add)} is not a two-input Add of "
                                       f"the graph of {node_label(norm)}", add)
    x, skip = add.inputs
    if not _same_shape(x, skip):
        known = x.shape is not None and skip.shape is not None and x.shape.rank is not None
        why = ("differ: the Add broadcasts, it is no residual connection" if known
               else "are not known to be equal (run infer-shapes)")
        return add, MatchResult().fail(f"SkipRMSNorm: shapes of '{x.name}' ({x.shape}) and "
                                       f"'{skip.name}' ({skip.shape}) {why}", add)
    if x.dtype is None or x.dtype != skip.dtype or x.dtype != norm.inputs[0].dtype:
        return add, MatchResult().fail(f"SkipRMSNorm: element types of '{x.name}' ({x.dtype}) and "
                                       f"'{skip.name}' ({skip.dtype}) are unknown or differ", add)
    return add, MatchResult()


def fuse_skip_rmsnorm(add: Node, norm: Node, opset: int = 21) -> Tuple[Node, bool]:
    """Replace ``add`` and ``norm`` (checked by :func:`check_skip_rmsnorm`) by one
    ``passctl::SkipRMSNorm(x, skip[, scale]; epsilon)``.

    Its outputs are ``(y, sum)`` when the Add's result is read elsewhere or is a graph output (every
    such use is rewired to ``sum``, a graph output keeping its name), else ``(y,)``. The new node
    takes the union of both nodes' provenance.

    Returns:
        ``(node, needs_sort)``: the new node, and whether the graph must be re-sorted (the scale is
        computed by a node placed between the Add and the RMSNorm).

    Raises:
        ReplacementError: the fused op's outputs would differ in element type or static shape
            from the values they replace (inferred from the inputs, ``opset`` for the standard
            ops); nothing has changed.
    """
    graph = norm.graph
    s, y = add.outputs[0], norm.outputs[0]
    keep_sum = s.is_graph_output() or any(u is not norm for u in s.consumers())
    scale = optional_input(norm, 1)
    ins = [add.inputs[0], add.inputs[1]] + ([scale] if scale is not None else [])
    fused = Node(DOMAIN, "SkipRMSNorm", ins, {"epsilon": float(norm.attr("epsilon"))},
                 [Value(graph.fresh_name(y.name + "_skip")),
                  *([Value(graph.fresh_name(s.name + "_sum"))] if keep_sum else [])],
                 name=graph.fresh_name((norm.name or "rmsnorm") + "_skip"))
    old_values = [y, s] if keep_sum else [y]
    try:
        checked_replace(graph, [add, norm], [fused], old_values, list(fused.outputs), opset)
    except ReplacementError:
        discard_nodes([fused])
        raise
    needs_sort = scale is not None and scale.producer is not None
    return fused, needs_sort


@register_pass
class FuseSkipRMSNorm(Pass):
    """Residual ``Add(x, skip)`` feeding ``passctl::RMSNorm`` -> ``passctl::SkipRMSNorm``.

    Rule (one): the RMSNorm's input is made by a two-input Add of x and skip with the same shape
    (a residual connection) and element type. Unlike the rewrite rules of ``fuse-layernorm``, the
    Add's result may also feed later nodes (a pre-norm decoder's residual stream): the fused op then
    has a second output, the sum, and those uses read it (ONNX Runtime's
    SkipSimplifiedLayerNormalization has the same 4th output, ``input_skip_bias_sum``). Run it after
    ``fuse-layernorm``, which makes the RMSNorms. Refusals are logged at debug level with the
    reason (:func:`check_skip_rmsnorm`).

    Statistics: ``skip_rmsnorm`` (pairs fused), ``with_sum`` (of those, how many keep the sum as
    output 2), ``refused`` (RMSNorms fed by an Add that did not fuse, or whose fused op would
    change a value's type: logged at info level).
    """

    name = "fuse-skip-rmsnorm"
    summary = "Fuse the residual Add before passctl::RMSNorm into passctl::SkipRMSNorm (sum kept as output 2)"

    def run(self, model: Model) -> PassResult:
        stats: Dict[str, int] = {"skip_rmsnorm": 0, "with_sum": 0, "refused": 0}
        for graph in model.graphs():
            needs_sort = False
            norms: List[Node] = [n for n in graph if n.domain == DOMAIN and n.op_type == "RMSNorm"]
            for norm in norms:
                add, ok = check_skip_rmsnorm(norm)
                if not ok:
                    if add is not None:
                        stats["refused"] += 1
                        logger.debug("%s: %s", self.name, ok.reason)
                    continue
                try:
                    fused, sort = fuse_skip_rmsnorm(add, norm, model.opset or 21)
                except ReplacementError as e:
                    stats["refused"] += 1
                    logger.info("%s: %s not fused: %s", self.name, node_label(norm), e)
                    continue
                needs_sort |= sort
                stats["skip_rmsnorm"] += 1
                stats["with_sum"] += len(fused.outputs) > 1
            if needs_sort:
                graph.sort(recursive=False)
        if stats["skip_rmsnorm"]:
            ensure_opset(model, DOMAIN, VERSION)
        return PassResult(stats["skip_rmsnorm"] > 0, stats)


__all__ = ["FuseSkipRMSNorm", "check_skip_rmsnorm", "fuse_skip_rmsnorm"]
