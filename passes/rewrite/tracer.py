"""The match tracer: best partial match of each rule per anchor node, and the ``explain`` report."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from passctl.ir import Node
from passctl.passes.rewrite.matcher import Match
from passctl.passes.rewrite.rule import RewriteRule

Entry = Tuple[int, str, Optional[Node], Node, Optional[Match]]


class MatchTracer:
    """Keeps, per rule and anchor node, the best attempt (highest score) and why it failed."""

    def __init__(self):
        self.best: Dict[Tuple[str, int], Entry] = {}

    def record(self, rule: RewriteRule, anchor: Node, score: int, reason: str,
               node: Optional[Node], match: Optional[Match]) -> None:
        """Remember an attempt of ``rule`` at ``anchor`` if it got at least as far as the best one."""
        key = (rule.name, id(anchor))
        old = self.best.get(key)
        if old is None or score >= old[0]:
            self.best[key] = (score, reason, node, anchor, match)

    def entries(self, rule_name: str) -> List[Entry]:
        """``(score, reason, node, anchor, match)`` per anchor for ``rule_name``, best first."""
        rows = [v for (name, _), v in self.best.items() if name == rule_name]
        return sorted(rows, key=lambda r: -r[0])


__all__ = ["MatchTracer"]
