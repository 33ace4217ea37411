"""``--check-each`` checks every stage, also those whose output holds passctl-only ops (no runtime
has kernels for them): such a stage runs as a copy through ``lower-standard``. The errors it
reports are checked against a numpy LayerNorm, not against passctl's numbers."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

from passctl.support.inputs import make_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
WRONG_PASS = os.path.join(HERE, "wrong_passctl_pass.py")
EPS = 0.5


def _decomposed_layernorm(path) -> None:
    """x[4,16] -> decomposed LayerNorm over the last axis (ReduceMean, Sub, Pow 2, ReduceMean,
    Add epsilon 0.5, Sqrt, Div, Mul gamma, Add beta) -> y. The large epsilon makes it matter."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (rng.uniform(0.5, 1.5, 16).astype(np.float32), "gamma"),
        (rng.uniform(-0.5, 0.5, 16).astype(np.float32), "beta"),
        (np.array(2.0, np.float32), "two"), (np.array(EPS, np.float32), "eps"),
        (np.array([-1], np.int64), "axes")]]
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"], name="mean"),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             helper.make_node("ReduceMean", ["d2", "axes"], ["var"], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="addeps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "gamma"], ["s"], name="scale"),
             helper.make_node("Add", ["s", "beta"], ["y"], name="shift")]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [4, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def _layernorm(x, gamma, beta, eps):
    x = x.astype(np.float64)
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * gamma + beta


def test_check_each_runs_passctl_only_stages_through_lower_standard(cli, tmp_path):
    model = tmp_path / "ln.onnx"
    _decomposed_layernorm(model)
    res = cli(model, "-p", "fuse-layernorm,wrong-passctl-epsilon,lower-standard", "--load",
              WRONG_PASS, "--check-each", "-o", tmp_path / "art")
    assert res.rc == 0, res.err
    lines = {m.group(1): m.group(0) for m in re.finditer(
        r"^check after \d+ (\S+): .*$", res.out, re.M)}
    assert set(lines) >= {"fuse-layernorm", "wrong-passctl-epsilon", "lower-standard"}, res.out
    assert not any("does not run" in l for l in lines.values()), res.out
    assert "through lower-standard" in lines["fuse-layernorm"]
    assert "through lower-standard" in lines["wrong-passctl-epsilon"]
    assert "through lower-standard" not in lines["lower-standard"]  # already standard ops
    # the numbers: the fused stage is the model's math; the wrong epsilon's error is what numpy
    # gives for epsilon 1e-5 instead of 0.5
    x = make_inputs(str(model), seed=0)["x"]
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(model)).graph.initializer}
    ref = _layernorm(x, init["gamma"], init["beta"], EPS)
    wrong = _layernorm(x, init["gamma"], init["beta"], 1e-5)
    expected = float(np.max(np.abs(ref - wrong)) / np.max(np.abs(ref)))
    got = {name: float(re.search(r"max_rel (\S+) ", line).group(1)) for name, line in lines.items()}
    assert got["fuse-layernorm"] < 1e-5 and "(ok)" in lines["fuse-layernorm"]
    assert expected > 0.1
    assert got["wrong-passctl-epsilon"] == pytest.approx(expected, rel=1e-2)
    assert "FAILED" in lines["wrong-passctl-epsilon"]
