"""Split ONNX Runtime's FusedConv back into Conv (+ Add Z) + activation (an int8 Conv unit)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from passctl.ir import Builder, Graph, Node

_NO_PARAMS = ("Relu", "Tanh", "Sigmoid")


def unfuse_conv(graph: Graph, node: Node) -> bool:
    """Replace ``com.microsoft`` FusedConv ``node`` by ``act(Conv(X, W, B) + Z)`` in standard ops.

    Math (ONNX Runtime ContribOperators.md, FusedConv): ``Y = activation(Conv(X, W, B) + Z)`` with
    ``activation`` one of Relu, Tanh, Sigmoid, LeakyRelu (``alpha``), Clip (``min``, ``max``),
    HardSigmoid (``alpha``, ``beta``) and its parameters in ``activation_params``. ONNX Runtime's
    QDQ fusion makes ``DequantizeLinear -> Conv -> QuantizeLinear`` a QLinearConv; FusedConv has no
    int8 kernel.

    Returns:
        False (graph unchanged) for an activation it does not know.
    """
    act = node.attr("activation", "")
    params: Sequence[float] = list(node.attr("activation_params", []) or [])
    if act not in _NO_PARAMS + ("LeakyRelu", "Clip", "HardSigmoid", ""):
        return False
    b = Builder(graph, before=node, provenance=node.provenance)
    conv_attrs = {k: a.value for k, a in node.attributes.items()
                  if k not in ("activation", "activation_params")}
    inputs = list(node.inputs[:3])
    while inputs and inputs[-1] is None:
        inputs.pop()
    y = b.op("Conv", *inputs, name=node.name or "Conv", **conv_attrs)
    y.type = node.outputs[0].type
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        y = b.op("Add", y, node.inputs[3], name=f"{node.name}_add_z")
        y.type = node.outputs[0].type
    if act in _NO_PARAMS:
        y = b.op(act, y, name=f"{node.name}_{act.lower()}")
    elif act == "LeakyRelu":
        y = b.op(act, y, alpha=float(params[0]) if params else 0.01, name=f"{node.name}_leakyrelu")
    elif act == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        y = b.op(act, y, alpha=float(alpha), beta=float(beta), name=f"{node.name}_hardsigmoid")
    elif act == "Clip":
        lo, hi = (float(params[0]), float(params[1])) if len(params) >= 2 else (None, None)
        bounds = [graph.add_constant(np.array(v, np.float32), f"{node.name}_clip") if v is not None
                  else None for v in (lo, hi)]
        y = b.op("Clip", y, *bounds, name=f"{node.name}_clip")
    y.type = node.outputs[0].type
    node.outputs[0].replace_all_uses_with(y, replace_graph_outputs=True)
    graph.remove(node)
    return True
