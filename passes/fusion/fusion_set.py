"""``FusionRuleSet``: a rule-set pass whose statistics also count fusions per family."""

from __future__ import annotations

from typing import Dict, Sequence

from passctl.ir import Model
from passctl.passes.base import PassResult
from passctl.dialect.canonical import DOMAIN, VERSION, ensure_opset
from passctl.passes.rewrite import RuleSet
from passctl.passes.rewrite.ruleset import RuleEntry


class FusionRuleSet(RuleSet):
    """A :class:`RuleSet` over ``RULES`` whose ``stats`` hold, besides the count per rule name, the
    total per family (``FAMILIES`` maps a reported rule or variant name to a family key such as
    ``"layernorm"``).

    When any rule fired, the ``passctl`` domain is added to the model's opset imports (the rules emit
    canonical ``passctl::`` ops, see :mod:`passctl.dialect.canonical`).
    """

    RULES: Sequence[RuleEntry] = ()
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


__all__ = ["FusionRuleSet"]
