"""``passctl diff A B``: what changed between two models (IR text, ONNX, two ``--dump-ir`` steps),
node by node, matched through provenance rather than by names.

Matching. Every node carries ``provenance``, the source-model node names it came from. Nodes of
``A`` and ``B`` that share a source name are linked; each connected group of linked nodes is one
change: one node on each side with the same op and attributes is ``unchanged`` (even when renamed),
with another op or attributes ``changed`` (the attribute differences listed); several nodes on
either side ``rewritten`` (e.g. ``Add, LayerNormalization -> passctl::SkipLayerNorm``; the same
ops, names and attributes on both sides are ``unchanged``); nodes only
in ``A`` are ``removed``, only in ``B`` ``added`` (a node without provenance is matched by
nothing). Main graphs only.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import numpy as np


def _attr_text(a) -> str:
    v = a.value
    if hasattr(v, "numpy"):
        try:
            arr = np.asarray(v.numpy())
            return f"tensor {arr.dtype}{list(arr.shape)}" + (f" {arr.tolist()}" if arr.size <= 8
                                                               else "")
        except Exception:  # noqa: BLE001 - an unreadable tensor is shown by its type
            return type(v).__name__
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v)


def _attrs(node) -> Dict[str, str]:
    return {k: _attr_text(a) for k, a in sorted(node.attributes.items())}


def _signature(node) -> tuple:
    return node.domain, node.op_type, node.name, tuple(_attrs(node).items())


def _label(node) -> str:
    op = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
    return f"{op} '{node.name}'" if node.name else op


def diff_models(a, b) -> List[Dict[str, Any]]:
    """The changes from :class:`passctl.ir.Model` ``a`` to ``b`` (module docstring), ordered by
    the first node of each group in ``a`` (then ``b``'s added nodes in ``b``'s order). Each is
    ``{"kind", "before": [labels], "after": [labels], "provenance": [names], "attributes":
    {name: [before, after]}}``."""
    na, nb = list(a.graph), list(b.graph)
    nodes = [("a", i, n) for i, n in enumerate(na)] + [("b", i, n) for i, n in enumerate(nb)]
    parent = list(range(len(nodes)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first: Dict[str, int] = {}
    for k, (_, _, n) in enumerate(nodes):
        for p in n.provenance:
            if p in first:
                parent[find(k)] = find(first[p])
            else:
                first[p] = k
    groups: Dict[int, List[int]] = {}
    for k in range(len(nodes)):
        groups.setdefault(find(k), []).append(k)
    changes = []
    for members in groups.values():
        left = [nodes[k][2] for k in members if nodes[k][0] == "a"]
        right = [nodes[k][2] for k in members if nodes[k][0] == "b"]
        order = min((nodes[k][1] if nodes[k][0] == "a" else len(na) + nodes[k][1]) for k in members)
        prov = list(dict.fromkeys(p for n in left + right for p in n.provenance))
        change: Dict[str, Any] = {"before": [_label(n) for n in left],
                                  "after": [_label(n) for n in right], "provenance": prov,
                                  "_order": order}
        if not right:
            change["kind"] = "removed"
        elif not left:
            change["kind"] = "added"
        elif len(left) == 1 and len(right) == 1:
            x, y = left[0], right[0]
            ax, ay = _attrs(x), _attrs(y)
            attrs = {k: [ax.get(k), ay.get(k)] for k in sorted(set(ax) | set(ay))
                     if ax.get(k) != ay.get(k)}
            same_op = (x.domain, x.op_type) == (y.domain, y.op_type)
            change["kind"] = "unchanged" if same_op and not attrs else "changed"
            if attrs:
                change["attributes"] = attrs
        else:
            same = sorted(_signature(n) for n in left) == sorted(_signature(n) for n in right)
            change["kind"] = "unchanged" if same else "rewritten"
        changes.append(change)
    changes.sort(key=lambda c: c.pop("_order"))
    return changes


def _line(c: Dict[str, Any]) -> str:
    mark = {"removed": "-", "added": "+", "changed": "~", "rewritten": "*", "unchanged": "="}
    if c["kind"] == "removed":
        body = ", ".join(c["before"])
    elif c["kind"] == "added":
        body = ", ".join(c["after"])
    else:
        body = f"{', '.join(c['before'])} -> {', '.join(c['after'])}"
    attrs = "; ".join(f"{k}: {v[0] if v[0] is not None else '(absent)'} -> "
                      f"{v[1] if v[1] is not None else '(absent)'}"
                      for k, v in c.get("attributes", {}).items())
    prov = ", ".join(c["provenance"][:4]) + (" ..." if len(c["provenance"]) > 4 else "")
    return (f"{mark[c['kind']]} {c['kind']:9s} {body}" + (f" [{attrs}]" if attrs else "")
            + (f"  (from {prov})" if prov else ""))



def main(args, console) -> int:
    from passctl.tools.model_source import load_model

    a, _ = load_model(args.a)
    b, _ = load_model(args.b)
    changes = diff_models(a, b)
    counts: Dict[str, int] = {}
    folded = 0
    for c in changes:
        counts[c["kind"]] = counts.get(c["kind"], 0) + 1
        if not args.all and c["kind"] == "removed" and c["before"] == ["Constant"]:
            folded += 1  # a nameless Constant (a weight) folded into an initializer: one line
        elif args.all or c["kind"] != "unchanged":
            console.print(_line(c), markup=False, highlight=False)
    if folded:
        console.print(f"- removed   {folded} nameless Constant nodes (weights; --all lists them)",
                      markup=False, highlight=False)
    console.print(", ".join(f"{counts.get(k, 0)} {k}" for k in
                            ("changed", "rewritten", "removed", "added", "unchanged")),
                  markup=False, highlight=False)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"counts": counts, "changes": changes}, f, indent=1)
    return 0


__all__: Tuple[str, ...] = ("diff_models",)
