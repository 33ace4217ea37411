"""What a rule's ``check`` and ``rewrite`` work with: MatchResult, RuleContext, the rewrite builder."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, List, Optional

from passctl.ir import Builder, Graph, Model, Node, Tensor, Value
from passctl.passes.rewrite.pattern import constant_value


class MatchResult:
    """Outcome of a rule's ``check``: true on success; ``fail(reason, node)`` marks a failure.

    Keywords are values the check computed for ``rewrite``, which receives them by name beside the
    bindings (no state kept on the rule between the two calls).

    Example: ``return MatchResult().fail("weight of Conv must be a constant", node)``;
    ``return MatchResult(plan=plan)``.
    """

    def __init__(self, **values: Any):
        self.success = True
        self.reason = ""
        self.node: Optional[Node] = None
        self.values: Dict[str, Any] = values

    def fail(self, reason: str = "", node: Optional[Node] = None) -> "MatchResult":
        """Mark failure with a human-readable ``reason`` (and the node it concerns); returns self."""
        self.success, self.reason, self.node = False, reason, node
        return self

    def __bool__(self):
        return self.success

    def __repr__(self):
        return "MatchResult(ok)" if self.success else f"MatchResult(failed: {self.reason})"


@dataclass
class RuleContext:
    """What ``check`` sees besides the bindings: the model, graph, the matched root and nodes."""

    model: Optional[Model]
    graph: Graph
    root: Node
    nodes: List[Node]

    @staticmethod
    def constant(value: Optional[Value]):
        """The numpy array of a constant value (initializer or Constant node), else None."""
        return constant_value(value)


class RewriterBuilder:
    """The ``op`` given to ``rewrite``: ``op.Gemm(x, w, b, transB=1)``, ``op.constant(array)``.

    Keywords ``_domain`` and ``_outputs`` as in the pattern builder; other keywords are attributes.
    Nodes are collected, not inserted, and constants are not added to the graph until
    :meth:`commit`: the rule checks the replacement's types first (and ``explain`` builds it
    without changing the model), then hands the nodes to ``Graph.replace_nodes``.
    """

    def __init__(self, graph: Graph):
        self.builder = Builder(graph, insert=False)
        self.graph = graph
        self.constants: List[Value] = []

    def __getattr__(self, op_type: str):
        if op_type.startswith("_"):
            raise AttributeError(op_type)

        def make(*inputs, _domain: str = "", _outputs: int = 1, **attrs):
            return self.builder.op(op_type, *inputs, domain=_domain, outputs=_outputs, **attrs)

        return make

    def op(self, op_type: str, *inputs, _domain: str = "", _outputs: int = 1, **attrs):
        return self.builder.op(op_type, *inputs, domain=_domain, outputs=_outputs, **attrs)

    def constant(self, array, name: str = "") -> Value:
        """A new constant holding ``array`` (numpy array or Tensor); it becomes an initializer of
        the graph on :meth:`commit`."""
        name = self.graph.fresh_name(name or "const")
        tensor = array if isinstance(array, Tensor) else Tensor(array)
        tensor.name = name
        value = Value(name, const=tensor)
        self.constants.append(value)
        return value

    def commit(self) -> None:
        """Add the constants built here to the graph (before the nodes are inserted)."""
        for v in self.constants:
            self.graph.add_initializer(v)
        self.constants = []

    def discard(self) -> None:
        """Drop what was built: detach the new nodes' inputs; the constants are never added."""
        for n in self.builder.nodes:
            if n.graph is None:
                n.set_inputs(())
        self.constants = []

    @property
    def nodes(self) -> List[Node]:
        return self.builder.nodes


_SIGNATURES: Dict[Any, Optional[FrozenSet[str]]] = {}


def call_with_bindings(fn: Callable, first, bindings: Dict[str, Any]):
    """``fn(first, **bindings)``, passing only the names ``fn`` takes (all with ``**kwargs``)."""
    key = getattr(fn, "__func__", fn)
    try:
        names = _SIGNATURES[key]
    except (KeyError, TypeError):
        params = inspect.signature(fn).parameters
        names = None if any(p.kind == p.VAR_KEYWORD for p in params.values()) else frozenset(params)
        try:
            _SIGNATURES[key] = names
        except TypeError:  # an unhashable callable: look it up every time
            pass
    if names is None:
        return fn(first, **bindings)
    return fn(first, **{k: v for k, v in bindings.items() if k in names})


__all__ = ["MatchResult", "RewriterBuilder", "RuleContext", "call_with_bindings"]
