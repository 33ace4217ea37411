"""``passctl bisect`` steps a lowering one node at a time (``Lowering.max_rewrites``): a wrong
Gelu form loaded with --load (tests/tools/compare/wrong_lowering.py; registered globally, so the
CLI runs in a separate process) is named with the node it lowered and that node's provenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from compare_helpers import HERE, max_rel, run_all_tensors
from onnx import TensorProto, helper, numpy_helper

from passctl.support.inputs import make_inputs


def _two_gelus(path) -> None:
    """x[2,8] -> (MatMul(w), exact erf Gelu) twice -> g1; nodes mm0, div0, erf0, add0, mul0,
    half0, then the same with 1."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes, x = [], "x"
    for i in range(2):
        nodes += [helper.make_node("MatMul", [x, "w"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Div", [f"m{i}", "sqrt2"], [f"d{i}"], name=f"div{i}"),
                  helper.make_node("Erf", [f"d{i}"], [f"e{i}"], name=f"erf{i}"),
                  helper.make_node("Add", [f"e{i}", "one"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Mul", [f"m{i}", f"a{i}"], [f"p{i}"], name=f"mul{i}"),
                  helper.make_node("Mul", [f"p{i}", "half"], [f"g{i}"], name=f"half{i}")]
        x = f"g{i}"
    graph = helper.make_graph(nodes, "gelus", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8])], [helper.make_tensor_value_info(
            "g1", TensorProto.FLOAT, [2, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _passctl(*argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", "passctl.tools.cli", *map(str, argv)],
                          capture_output=True, text=True, env=env, timeout=300)


def test_bisect_names_the_wrong_lowering_form_and_the_first_gelu(tmp_path):
    model = tmp_path / "gelus.onnx"
    _two_gelus(model)
    plugin = os.path.join(HERE, "wrong_lowering.py")
    # independently: x * sigmoid(1.5 x) in place of the first Gelu breaks max-rel 1e-4
    feeds = make_inputs(str(model), seed=0)
    ref = run_all_tensors(onnx.load(str(model)), feeds)
    m0 = ref["m0"].astype(np.float64)
    assert max_rel(ref["g0"], m0 / (1 + np.exp(-1.5 * m0))) > 1e-4
    run = _passctl("bisect", model, "-p", "cleanup,fuse", "--load", plugin,
                   "--bound", "max-rel=1e-4", "-o", tmp_path / "repro")
    assert run.returncode == 0, run.stderr
    assert "lower-onnxruntime" in run.stdout
    line = next(l for l in run.stdout.splitlines() if l.startswith("first rewrite breaking it"))
    assert line.startswith("first rewrite breaking it: #1 rule 'Gelu->wrong-sigmoid'"), line
    assert line.endswith("provenance div0, erf0, add0, mul0, half0"), line
    with open(tmp_path / "repro" / "rewrite.json") as f:
        info = json.load(f)
    assert [n["op"] for n in info["rewrite"]["new"]] == ["Mul", "Sigmoid", "Mul"]
    # compare names the first Gelu's output, by its original name
    run = _passctl("compare", model, "-p", "cleanup,fuse", "--load", plugin, "-o", tmp_path)
    assert run.returncode == 0, run.stderr
    with open(tmp_path / "compare.json") as f:
        assert json.load(f)["first_jump"] == "g0"
