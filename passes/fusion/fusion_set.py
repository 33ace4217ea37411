"""``FusionRuleSet``: a rule-set pass whose statistics also count fusions per family."""

from __future__ import annotations

import itertools
from typing import Callable, Dict, List, Sequence, Type

from passctl.ir import Model
from passctl.passes.base import PassResult
from passctl.dialect.canonical import DOMAIN, VERSION, ensure_opset
from passctl.passes.rewrite import RewriteRule, RuleSet, register_rule


class FusionRuleSet(RuleSet):
    """A :class:`RuleSet` over ``RULES`` whose ``stats`` hold, besides the count per rule name, the
    total per family (``FAMILIES`` maps a rule name to a family key such as ``"layernorm"``).

    When any rule fired, the ``passctl`` domain is added to the model's opset imports (the rules emit
    canonical ``passctl::`` ops, see :mod:`passctl.dialect.canonical`).
    """

    RULES: Sequence[Type[RewriteRule]] = ()
    FAMILIES: Dict[str, str] = {}

    def __init__(self, options=None, **kwargs):
        super().__init__(self.RULES, options, **kwargs)

    def run(self, model: Model) -> PassResult:
        result = super().run(model)
        totals: Dict[str, int] = {f: 0 for f in dict.fromkeys(self.FAMILIES.values())}
        for rule, count in result.stats.items():
            family = self.FAMILIES.get(rule)
            if family is not None:
                totals[family] += count
        if result.modified:
            ensure_opset(model, DOMAIN, VERSION)
        return PassResult(result.modified, {**totals, **result.stats})


def make_variants(base: Type[RewriteRule], prefix: str, choices: Dict[str, Sequence[str]],
                  summary: Callable[[Dict[str, str]], str]) -> List[Type[RewriteRule]]:
    """Register one subclass of ``base`` per combination of ``choices`` (the way exporters write a
    pattern), named ``prefix-<choice>-<choice>...``; each subclass gets the choices as class
    attributes that ``base.pattern`` reads.

    Example: ``choices={"square": ("pow", "mul"), "normalize": ("div", "reciprocal")}`` makes four
    rules ``layernorm-pow-div``, ``layernorm-pow-reciprocal``, ...

    Returns:
        The registered rule classes, in combination order.
    """
    keys = list(choices)
    out = []
    for combo in itertools.product(*(choices[k] for k in keys)):
        attrs = dict(zip(keys, combo))
        name = "-".join([prefix, *combo])
        cls = type(base.__name__ + "_" + "_".join(c.replace("-", "_") for c in combo), (base,),
                   {"name": name, "summary": summary(attrs), **attrs, "__module__": base.__module__})
        out.append(register_rule(cls))
    return out


__all__ = ["FusionRuleSet", "make_variants"]
