"""Rule registry and ``RuleSet``: a list of rewrite rules applied as one pass, counting each rule."""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Type, Union

from passctl.ir import Model
from passctl.ir.errors import UserError
from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import register_pass
from passctl.passes.rewrite.rule import RewriteRule
from passctl.passes.rewrite.tracer import MatchTracer

logger = logging.getLogger(__name__)

RuleEntry = Union[Type[RewriteRule], RewriteRule]

_RULES: Dict[str, RuleEntry] = {}
# Old or variant name -> registered rule name (``passctl explain OLDNAME`` keeps working).
_ALIASES: Dict[str, str] = {}


def _origin(rule: RuleEntry) -> tuple:
    cls = rule if isinstance(rule, type) else type(rule)
    return cls.__module__, cls.__qualname__


def register_rule(rule: RuleEntry) -> RuleEntry:
    """Register a rewrite rule under its ``name``: a :class:`RewriteRule` subclass (as a class
    decorator) or an instance of one (a module-level rule object: ``r = register_rule(Rule(...))``).

    The rule's ``aliases`` and the statistics names its ``variant`` can produce are registered as
    other names of it (for :func:`get_rule` and ``passctl explain``).

    Returns:
        ``rule`` itself.

    Raises:
        TypeError: not a RewriteRule subclass or instance, or no name.
        ValueError: another rule already has that name.
    """
    is_class = isinstance(rule, type) and issubclass(rule, RewriteRule)
    if not (is_class or isinstance(rule, RewriteRule)) or not rule.name:
        raise TypeError(f"register_rule: {rule!r} must be a RewriteRule subclass or instance with a name")
    old = _RULES.get(rule.name)
    if old is not None and old is not rule and (isinstance(old, type) != is_class or
                                                _origin(old) != _origin(rule)):
        module, qualname = _origin(old)
        raise ValueError(f"register_rule: rule '{rule.name}' is already registered by {module}.{qualname}")
    _RULES[rule.name] = rule
    names = list(rule.aliases)
    if rule.variant:
        names += (rule() if is_class else rule).variant_names()
    for alias in names:
        if alias != rule.name and alias not in _RULES:
            _ALIASES[alias] = rule.name
    return rule


def resolve_rule_name(name: str) -> Optional[str]:
    """The registered rule name for ``name`` (itself, or the rule an alias stands for); None."""
    if name in _RULES:
        return name
    target = _ALIASES.get(name)
    return target if target in _RULES else None


def get_rule(name: str) -> RuleEntry:
    """The rule registered as ``name`` or under the alias ``name`` (an old or variant name), a class
    or a rule object (built-in pass modules are imported first).

    Raises:
        UserError: unknown rule; suggests the closest names.
    """
    from passctl.passes.registry import _ensure_loaded

    _ensure_loaded()
    found = resolve_rule_name(name)
    if found is not None:
        return _RULES[found]
    close = difflib.get_close_matches(name, sorted(_RULES) + sorted(_ALIASES), n=3)
    hint = ("did you mean " + " or ".join(f"'{c}'" for c in close) + "?") if close else (
        f"{len(_RULES)} rules are registered; `passctl list-rules` lists them with their patterns")
    raise UserError(f"unknown rewrite rule '{name}'; {hint}")


def natural_key(name: str) -> tuple:
    """Sort key putting names in natural order: runs of digits compare as numbers, so
    ``attention-2`` sorts before ``attention-10`` (plain string order puts it after).

    Args:
        name: any string, e.g. a rule name.

    Returns:
        ``(parts, name)``: ``parts`` alternates text and int (text at even positions, so any two
        keys compare str with str and int with int); ``name`` breaks ties between names that
        differ only in leading zeros (``a01``, ``a1``).
    """
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def list_rules() -> List[RuleEntry]:
    """All registered rules (classes and rule objects; ``entry()`` gives a rule object of either),
    by name in natural order (:func:`natural_key`). Aliases are not listed."""
    from passctl.passes.registry import _ensure_loaded

    _ensure_loaded()
    return [_RULES[n] for n in sorted(_RULES, key=natural_key)]


@dataclass
class RuleSetOptions:
    """Options of a rule-set pass.

    Attributes:
        max_sweeps: most sweeps over the graph (>= 1, else the pass refuses with a UserError); a
            sweep tries every rule at every node, and the next sweep sees the nodes the previous
            one created.
    """

    max_sweeps: int = 8


class RuleSet(Pass):
    """Applies rewrite rules as one pass; ``stats`` counts applications per rule name.

    At every node (main graph, subgraphs, function bodies, in order) the rules whose root op type
    is the node's (any of a rule's root alternatives) are tried in list order; the first that fires
    wins. An application counts under the rule's reported name (its ``variant``, else its name). Sweeps repeat until one
    changes nothing or ``max_sweeps`` ran. A graph whose rewrites read a value defined between the
    replaced nodes is re-sorted topologically once at the end.

    Args:
        rules: rule objects or classes.
        name: the pass name (``rule-set`` by default).
        options: :class:`RuleSetOptions`.
        tracer: a :class:`MatchTracer` that records every attempt (for explanations).
    """

    name = "rule-set"
    summary = "apply rewrite rules"
    Options = RuleSetOptions
    #: ``passctl bisect``'s stepping hook: stop after this many rule applications (None: no
    #: limit). Each application is recorded in ``applied`` as ``(reported rule name, root node,
    #: replaced nodes, new nodes)`` (the nodes as they were when the rule fired).
    max_rewrites: Optional[int] = None

    def __init__(self, rules: Sequence[RuleEntry] = (), options=None,
                 name: Optional[str] = None, tracer: Optional[MatchTracer] = None, **kwargs):
        super().__init__(options, **kwargs)
        if name is not None:
            self.name = name
        self.rules = [r() if isinstance(r, type) else r for r in rules]
        self.tracer = tracer
        sweeps = getattr(self.options, "max_sweeps", 1)
        if not isinstance(sweeps, int) or sweeps < 1:  # 0 sweeps would silently apply nothing
            raise UserError(f"{self.name}: max_sweeps={sweeps} must be >= 1 (with no sweep the "
                            "pass applies no rule, silently; the default is "
                            f"{type(self.options)().max_sweeps})")

    def run(self, model: Model) -> PassResult:
        counts: Dict[str, int] = {}
        self.applied: List[tuple] = []
        by_op: Dict[str, List[RewriteRule]] = {}
        for r in self.rules:
            for _, op_type in r.root_ops:
                by_op.setdefault(op_type, []).append(r)
        for sweep in range(self.options.max_sweeps):
            changed = False
            for graph in model.graphs():
                needs_sort = False
                for node in graph:
                    if node.graph is not graph:
                        continue
                    if self.max_rewrites is not None and len(self.applied) >= self.max_rewrites:
                        break
                    for rule in by_op.get(node.op_type, ()):
                        rep = rule.apply(node, model, self.tracer)
                        if rep is None:
                            continue
                        key = rep.name or rule.name
                        counts[key] = counts.get(key, 0) + 1
                        self.applied.append((key, node, tuple(rep.old_nodes), tuple(rep.new_nodes)))
                        changed = True
                        needs_sort |= rep.needs_sort
                        break
                if needs_sort:
                    graph.sort(recursive=False)
            if not changed:
                break
        else:
            logger.warning("rule set '%s' still rewrote after %d sweeps; stopped", self.name,
                           self.options.max_sweeps)
        return PassResult(bool(counts), counts)


def register_rule_set(pass_name: str, rules: Sequence[Union[str, RuleEntry]],
                      summary: str) -> Type[Pass]:
    """Register a pass ``pass_name`` that applies ``rules`` (names, classes or rule objects) as a
    :class:`RuleSet`.

    Returns:
        The new Pass subclass (registered with :func:`register_pass`).
    """
    rule_list = list(rules)

    class _RuleSetPass(RuleSet):
        def __init__(self, options=None, **kwargs):
            classes = [get_rule(r) if isinstance(r, str) else r for r in rule_list]
            super().__init__(classes, options, **kwargs)

    _RuleSetPass.name = pass_name
    _RuleSetPass.summary = summary
    _RuleSetPass.__qualname__ = _RuleSetPass.__name__ = "RuleSet_" + pass_name.replace("-", "_")
    return register_pass(_RuleSetPass)
