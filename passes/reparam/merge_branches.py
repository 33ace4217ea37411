"""reparam-branches: merge multi-branch conv blocks (RepVGG, ACNet, DBB, MobileOne) into one Conv."""

from __future__ import annotations

import logging
from collections import deque
from typing import Dict, List, Optional, Tuple

from passctl.ir import Builder, Graph, Model, Node, Tensor, Value
from passctl.passes.base import Pass, PassResult
from passctl.passes.common.constants import constant_array
from passctl.passes.reparam.branches import Form, Recognizer, is_candidate
from passctl.passes.reparam.merge import kernel_attributes
from passctl.passes.registry import register_pass
from passctl.passes.rewrite.rule import APPLIED
from passctl.passes.rewrite.types import ReplacementError, discard_nodes, replacement_conflict

logger = logging.getLogger(__name__)


def _absorbed(node: Node) -> bool:
    """The node's output feeds exactly one branch op, so that op's root will reach it."""
    out = node.outputs[0]
    users = out.consumers()
    return len(node.outputs) == 1 and not out.is_graph_output() and len(users) == 1 and \
        is_candidate(users[0])


# The activation patterns whose scalar Mul / Div / Add steps (GELU's "* 0.5", HardSwish's "/ 6", the
# "+ 3" before its Clip) reparam would otherwise fold into a neighbouring Conv, so that fuse finds no
# GELU / HardSwish afterwards. Rule objects or classes of passctl.passes.fusion.
def _activation_rules():
    from passctl.passes.fusion.activations import FuseActivations
    from passctl.passes.fusion.gelu import FuseGelu

    return [r() if isinstance(r, type) else r for r in (*FuseGelu.RULES, *FuseActivations.RULES)]


def fusion_pattern_nodes(graph: Graph, model: Optional[Model] = None) -> Dict[Node, str]:
    """The nodes of ``graph`` that a GELU / SiLU / HardSwish rule of ``fuse`` would fuse (a full
    match whose check passes), mapped to the rule name; reparam leaves them alone (reparam runs
    before fuse, and folding GELU's ``* 0.5`` into the next Conv left most GELUs unfused)."""
    rules = _activation_rules()
    by_op: Dict[str, list] = {}
    for r in rules:
        for _, op_type in r.root_ops:
            by_op.setdefault(op_type, []).append(r)
    found: Dict[Node, str] = {}
    for node in graph:
        for rule in by_op.get(node.op_type, ()):
            for score, _, _, m, _ in rule.attempts(node, model):
                if score == rule.matcher.size + APPLIED and m is not None:
                    for n in m.nodes.values():
                        found.setdefault(n, rule.name)
                    break
            if node in found:
                break
    return found


@register_pass
class ReparamBranches(Pass):
    """Structural re-parameterization: a sum of linear convolution branches of one input becomes one
    Conv with bias; a single Conv followed by BN / per-channel constants is folded the same way.

    Recognized from the graph alone (never from names), rules:
      1. Parallel branches summed by ``Add`` (chains and trees of Adds): Conv kxk + BN, Conv 1x1 + BN,
         identity through BN alone or bare (RepVGG), Conv 1xk + Conv kx1 (ACNet), MobileOne's k
         over-parameterized kxk branches plus its 1x1 "scale" branch.
      2. Sequential branches: Conv 1x1 -> (Pad) -> BN -> Conv kxk -> BN and Conv 1x1 -> (Pad) -> BN
         -> AveragePool -> BN (DBB), and a BN or per-channel ``Mul/Add/Sub/Div`` constant before a
         Conv without padding.
      3. A single Conv followed by BN / per-channel constants (the fold ``fuse-conv-bn`` does, through
         the same :func:`passctl.passes.fusion.bn_math.fold_scale_shift_into_conv_weights`).

    Merging (:mod:`passctl.passes.reparam.merge`; RepVGG, ACNet, DBB and MobileOne papers): each BN
    with its own epsilon, smaller kernels zero-padded to kxk at the offset their padding implies,
    identity as a one-hot kernel, group-aware. Branches are not merged when strides, dilations,
    groups or channel counts differ, when padding does not line up, or when a branch intermediate
    has another consumer or is a graph output; the reason is logged (INFO), kept in
    :attr:`unmerged` and shown by :func:`passctl.passes.reparam.explain_reparam`.

    Statistics: ``merged`` (multi-branch blocks), ``branches`` (branches they had), ``folded``
    (single-branch folds), ``unmerged`` (Add trees left as they were).

    Attributes:
        unmerged: after :meth:`run`, ``{root node name: reason}`` of the Add trees not merged.
        merged: after :meth:`run`, ``(root node name, branch count, merged kernel)`` per rewrite
            (branch count 1 for a single-branch fold).
    """

    name = "reparam-branches"
    summary = "Merge parallel / sequential conv branches (RepVGG, ACNet, DBB, MobileOne) into one Conv"

    def run(self, model: Model) -> PassResult:
        stats: Dict[str, int] = {"merged": 0, "branches": 0, "folded": 0}
        self.unmerged: Dict[str, str] = {}
        self.merged: List[Tuple[str, int, str]] = []
        self._opset = model.opset or 21
        for graph in model.graphs():
            self._protected = fusion_pattern_nodes(graph, model)
            self._run_graph(graph, stats, self.unmerged)
        if self.unmerged:
            stats["unmerged"] = len(self.unmerged)
        modified = bool(stats["merged"] or stats["folded"])
        return PassResult(modified, stats)

    def _run_graph(self, graph: Graph, stats: Dict[str, int], unmerged: Dict[str, str]) -> None:
        queue = deque(n for n in graph if is_candidate(n) and not _absorbed(n) and n not in self._protected)
        done = set()
        while queue:
            root = queue.popleft()
            if root.graph is not graph or id(root) in done:
                continue
            done.add(id(root))
            form = Recognizer(graph, self._protected).run(root)
            # A source made of branch ops is a root of its own; when the branches did not merge,
            # so is each operand of the root (the parts below it may still merge or fold).
            values = [t.source for t in form.terms]
            if len(form.terms) > 1:
                values += [v for v in root.inputs if v is not None]
            for v in values:
                p = v.producer
                if p is not None and p.graph is graph and is_candidate(p) and id(p) not in done:
                    queue.append(p)
            if len(form.terms) > 1:
                if form.adds:
                    reason = "; ".join(dict.fromkeys(form.notes)) or (
                        "branches read different values: " +
                        ", ".join(f"'{t.source.name}'" for t in form.terms))
                    unmerged[root.name or root.outputs[0].name] = reason
                    logger.info("reparam: %s '%s' not merged: %s", root.op_type, root.name, reason)
                continue
            kernel = form.terms[0].kernel
            if kernel is None or kernel.convs == 0 or len(form.nodes) < 2:
                continue
            try:
                self._rewrite(graph, root, form)
            except ReplacementError as e:
                unmerged[root.name or root.outputs[0].name] = str(e)
                logger.info("reparam: %s '%s' not merged: %s", root.op_type, root.name, e)
                continue
            self.merged.append((root.name or root.outputs[0].name, form.adds + 1, kernel.describe()))
            if form.adds:
                stats["merged"] += 1
                stats["branches"] += form.adds + 1
            else:
                stats["folded"] += 1

    def _rewrite(self, graph: Graph, root: Node, form: Form) -> None:
        (term,) = form.terms
        kernel = term.kernel
        np_dtype = next(constant_array(n.inputs[1]).dtype for n in form.nodes if n.op_type == "Conv")
        base = root.name.strip("/").replace("/", "_") or "reparam"
        w = Value(graph.fresh_name(f"{base}_reparam_weight"), const=Tensor(kernel.weight.astype(np_dtype)))
        b = Value(graph.fresh_name(f"{base}_reparam_bias"), const=Tensor(kernel.bias.astype(np_dtype)))
        builder = Builder(graph, insert=False)
        out = builder.op("Conv", term.source, w, b, name=f"{base}_reparam", **kernel_attributes(kernel))
        old = root.outputs[0]
        nodes = [n for n in graph if n in form.nodes]
        keep_name = not old.is_graph_output()
        why = replacement_conflict(nodes, builder.nodes, [old], [out], self._opset)
        if why is not None:  # the merged Conv would not compute the block's shape: keep the block
            discard_nodes(builder.nodes)
            raise ReplacementError(why)
        for v in (w, b):
            v.const.name = v.name
            graph.add_initializer(v)
        graph.replace_nodes(nodes, builder.nodes, [old], [out])
        if keep_name:  # the merged value keeps the block output's name (graph outputs already do)
            name = old.name
            old.name = graph.fresh_name(name + "_replaced")
            out.name = name


__all__ = ["ReparamBranches"]
