"""dce: remove dead nodes, unused initializers and unused model-local functions."""

from __future__ import annotations

import logging
from typing import Dict, Set, Tuple

from passctl.ir import Graph, Model
from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import register_pass

logger = logging.getLogger(__name__)


@register_pass
class DeadCodeElimination(Pass):
    """Dead code elimination.

    Rules:
      1. A node none of whose outputs is used or is an output of its graph is removed; this runs
         backwards, so whole dead chains go in one sweep, and inside every subgraph and function body
         (a subgraph is cleaned before the node that holds it is looked at, so outer values read only
         by dead subgraph nodes become dead too).
      2. An initializer that is not used, not a graph output and not a graph input is removed
         (an initializer that is also a graph input is part of the model's interface).
      3. A model-local function that no node calls (directly, or through another called
         function) is removed.

    ONNX nodes have no side effects, so any op may be removed, custom-domain ones included.

    Statistics: ``nodes_removed``, ``initializers_removed``, ``functions_removed``.
    """

    name = "dce"
    summary = "Remove unused nodes, initializers and model-local functions"

    def run(self, model: Model) -> PassResult:
        stats = {"nodes_removed": 0, "initializers_removed": 0, "functions_removed": 0}
        _clean_graph(model.graph, stats)
        for fn in model.functions.values():
            _clean_graph(fn.graph, stats)
        stats["functions_removed"] = _remove_unused_functions(model)
        modified = any(stats.values())
        return PassResult(modified, stats)


def _clean_graph(graph: Graph, stats: Dict[str, int]) -> None:
    outputs = {id(v) for v in graph.outputs}
    for node in reversed(graph.nodes):
        for sub in node.subgraphs():
            _clean_graph(sub, stats)
        if any(v.uses() or id(v) in outputs for v in node.outputs):
            continue
        graph.remove(node, safe=False)
        stats["nodes_removed"] += 1
    for name, value in list(graph.initializers.items()):
        if value.uses() or id(value) in outputs or value.is_graph_input():
            continue
        graph.remove_initializer(name)
        stats["initializers_removed"] += 1


def _remove_unused_functions(model: Model) -> int:
    if not model.functions:
        return 0
    keys = set(model.functions)

    def called(graph: Graph) -> Set[Tuple[str, str, str]]:
        return {(n.domain, n.op_type, n.overload) for n in graph.all_nodes()} & keys

    live: Set[Tuple[str, str, str]] = set()
    todo = list(called(model.graph))
    while todo:
        key = todo.pop()
        if key in live:
            continue
        live.add(key)
        todo.extend(called(model.functions[key].graph) - live)
    dead = keys - live
    for key in dead:
        logger.debug("dce: removing unused function %s::%s", key[0], key[1])
        del model.functions[key]
    return len(dead)
