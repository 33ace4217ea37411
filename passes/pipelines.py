"""Named pass groups (aliases) per target, as plain ordered lists."""

from __future__ import annotations

from typing import Dict, List, Optional

# Every alias of every target. An alias that maps to an empty list exists (so the name is reserved and
# documented) but has no passes yet; using it is a UserError that names what is missing.
DEFAULT_TARGET = "cpu"

CLEANUP: List[str] = [
    # NOTE: infer-shapes first: fold-constants can fold Shape (and Slice/Gather of Shape) only where the
    # input's shape is known, and models often declare none for intermediate values.
    "infer-shapes",
    # NOTE: eliminate-identity next: Identity nodes hide constant inputs from fold-constants and make
    # equal expressions look different to cse.
    "eliminate-identity",
    # NOTE: fold-constants before cse: folding turns subgraphs into initializers, and cse then merges
    # equal ones; the other order would compare expressions that are about to disappear.
    "fold-constants",
    "cse",
    # NOTE: dce last: folding and cse leave dead producers and initializers behind.
    "dce",
]

# alias -> target -> ordered pass names. A target missing here uses DEFAULT_TARGET's list.
ALIASES: Dict[str, Dict[str, List[str]]] = {
    "cleanup": {DEFAULT_TARGET: CLEANUP},
    "fuse": {DEFAULT_TARGET: []},
    "reparam": {DEFAULT_TARGET: []},
    "amp": {DEFAULT_TARGET: []},
    "flash-attn": {DEFAULT_TARGET: []},
    "quantize": {DEFAULT_TARGET: []},
}

# Why an alias without passes fails: the feature that will bring them.
NOT_YET: Dict[str, str] = {
    "fuse": "operator fusion is not implemented in this version",
    "reparam": "structural re-parameterization (RepVGG, MobileOne, ...) is not implemented in this version",
    "amp": "automatic mixed precision is not implemented in this version",
    "flash-attn": "attention substitution (FlashAttention / fused attention) is not implemented in this version",
    "quantize": "quantization is not implemented in this version",
}


def alias_passes(alias: str, target: Optional[str] = None) -> Optional[List[str]]:
    """The ordered pass names of ``alias`` for ``target`` (``None`` when ``alias`` is not an alias).

    Args:
        alias: A group name such as ``"cleanup"``.
        target: A target profile name (``"cpu"``, ``"a10"``...); ``None`` means :data:`DEFAULT_TARGET`.

    Returns:
        A new list (possibly empty for a reserved alias), or ``None`` for a name that is not an alias.
    """
    per_target = ALIASES.get(alias)
    if per_target is None:
        return None
    names = per_target.get(target or DEFAULT_TARGET, per_target.get(DEFAULT_TARGET, []))
    return list(names)
