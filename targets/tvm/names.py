"""C-identifier value names for the ONNX graph handed to TVM's frontend (its CUDA codegen needs them)."""

from __future__ import annotations

import re
from typing import Dict

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def _is_identifier(name: str) -> bool:
    return bool(name) and not _UNSAFE.search(name) and not name[0].isdigit()


def safe_value_names(graph) -> Dict[str, str]:
    """Rename every value of ``graph`` (an ``onnx.GraphProto``, in place, subgraphs included) whose
    name is not a C identifier.

    TVM 0.27's Relax ONNX frontend sanitizes the ``main`` parameter names but a weight or folded
    constant named like ``/bert/embeddings/position_embeddings/Gather_output_0`` keeps its name as
    the TIR buffer name of the fused kernels that read it; the CUDA codegen then declares
    ``float* __restrict__ /bert/..._ptr`` and nvcc / NVRTC reject the source ("expected a ')'",
    6 errors for BERT). The llvm codegen never prints names, so only CUDA builds failed.

    New names are ``v<index>_<old name with every non [A-Za-z0-9_] character as _>``, unique.
    Graph inputs and outputs are renamed too: the artifact passes inputs by position and its
    manifest keeps the IR's names.

    Args:
        graph: the ``onnx.GraphProto`` (modified in place).

    Returns:
        ``{old name: new name}`` for the renamed values (empty when all names were identifiers).
    """
    names = set()

    def collect(g):
        for v in list(g.input) + list(g.output) + list(g.value_info):
            names.add(v.name)
        for t in g.initializer:
            names.add(t.name)
        for n in g.node:
            names.update(x for x in list(n.input) + list(n.output) if x)
            for a in n.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    collect(sub)

    collect(graph)
    mapping: Dict[str, str] = {}
    for i, name in enumerate(sorted(names)):
        if not _is_identifier(name):
            new = f"v{i}_{_UNSAFE.sub('_', name)}"
            while new in names:
                new += "_"
            mapping[name] = new
    if not mapping:
        return mapping

    def rename(g):
        for v in list(g.input) + list(g.output) + list(g.value_info):
            v.name = mapping.get(v.name, v.name)
        for t in g.initializer:
            t.name = mapping.get(t.name, t.name)
        for n in g.node:
            n.input[:] = [mapping.get(x, x) for x in n.input]
            n.output[:] = [mapping.get(x, x) for x in n.output]
            for a in n.attribute:
                if a.HasField("t"):
                    a.t.name = mapping.get(a.t.name, a.t.name)
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    rename(sub)

    rename(graph)
    return mapping


__all__ = ["safe_value_names"]
