"""``explain_reparam``: which conv branch blocks reparam-branches merges, and why not the others."""

from __future__ import annotations

from passctl.ir import Model
from passctl.passes._snapshot import clone_model
from passctl.passes.reparam.merge_branches import ReparamBranches


def explain_reparam(model: Model, limit: int = 50) -> str:
    """A report for people: each block ``reparam-branches`` would merge (root node, branch count,
    resulting kernel) and each Add tree it would leave, with the reason. Runs the pass on a copy,
    so ``model`` is not changed.

    Args:
        model: the model to inspect.
        limit: most lines per section; the rest are counted.

    Returns:
        A multi-line text, e.g. ``"Add 'a' (2 branches) -> 3x3 kernel (...)"`` and
        ``"not merged: Add 'b': branches have different strides ([1, 1] vs [2, 2])"``.
    """
    p = ReparamBranches()
    p(clone_model(model))
    merged = [m for m in p.merged if m[1] > 1]
    folded = len(p.merged) - len(merged)
    lines = [f"reparam-branches: {len(merged)} block(s) merged, {folded} single-branch fold(s), "
             f"{len(p.unmerged)} Add tree(s) not merged"]
    for name, branches, kernel in merged[:limit]:
        lines.append(f"  merged: '{name}' ({branches} branches) -> one Conv, {kernel}")
    for name, reason in list(p.unmerged.items())[:limit]:
        lines.append(f"  not merged: '{name}': {reason}")
    hidden = max(0, len(merged) - limit) + max(0, len(p.unmerged) - limit)
    if hidden:
        lines.append(f"  ... and {hidden} more")
    return "\n".join(lines)


__all__ = ["explain_reparam"]
