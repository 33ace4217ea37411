"""RuleSet.max_rewrites (passctl bisect's stepping hook): exactly the first k rule applications,
each recorded in ``applied``."""

from __future__ import annotations

import numpy as np
import onnx
from compare_helpers import WRONG_RULES
from onnx import TensorProto, helper, numpy_helper

from passctl.passes.registry import get_pass, load_plugin_file
from passctl.tools.model_source import load_model


def _three_layernorms(path) -> None:
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "s"),
             numpy_helper.from_array(np.zeros(4, np.float32), "b")]
    nodes = [helper.make_node("LayerNormalization", [x, "s", "b"], [y], name=f"ln{i}",
                              epsilon=1e-3 * (i + 1))
             for i, (x, y) in enumerate([("x", "y0"), ("y0", "y1"), ("y1", "y")])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_max_rewrites_applies_the_first_k_in_graph_order(tmp_path):
    load_plugin_file(WRONG_RULES)
    path = tmp_path / "m.onnx"
    _three_layernorms(path)
    for k, expect in [(0, [1e-3, 2e-3, 3e-3]), (2, [None, None, 3e-3]), (None, [None] * 3)]:
        model, _ = load_model(str(path))
        p = get_pass("wrong-layernorm")()
        p.max_rewrites = k
        result = p(model)
        eps = [n.attr("epsilon") for n in model.graph]
        assert [e if e is None else round(e, 6) for e in eps] == expect
        applied = p.applied
        assert len(applied) == expect.count(None)
        assert [root.name for _, root, _, _ in applied] == [f"ln{i}" for i in range(len(applied))]
        assert all(rule == "drop-layernorm-epsilon" for rule, _, _, _ in applied)
        assert result.modified == bool(applied)
