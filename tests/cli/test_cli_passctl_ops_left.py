"""A fusion run without its lowering leaves passctl-only ops: compile refuses with one line naming
the node and the pass to add (exit 2), and writes no output folder."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _layernorm_model(path) -> None:
    """y = LayerNorm(x) over the last axis, written as the legacy exporter spells it."""
    g = numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "gamma")
    b = numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "beta")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    eps = numpy_helper.from_array(np.array(1e-5, np.float32), "eps")
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], name="mean"),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "gamma"], ["ng"], name="mul"),
             helper.make_node("Add", ["ng", "beta"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 4, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 4, 8])], [g, b, two, eps])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_passctl_only_ops_at_emit_are_a_user_error(cli, tmp_path):
    model = tmp_path / "ln.onnx"
    _layernorm_model(model)
    out = tmp_path / "out"
    res = cli("compile", model, "--pipeline", "fuse-layernorm", "--target", "cpu", "-o", out)
    lines = res.err.strip().splitlines()
    assert res.rc == 2, res.err
    assert len(lines) == 1 and lines[0].startswith("passctl: error: "), res.err
    assert "passctl::" in lines[0] and "lower-onnxruntime" in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]


def test_with_the_lowering_the_same_pipeline_compiles_and_matches(cli, tmp_path):
    model = tmp_path / "ln.onnx"
    _layernorm_model(model)
    out = tmp_path / "out"
    res = cli("compile", model, "--pipeline", "fuse-layernorm,lower-onnxruntime", "--target",
              "cpu", "-o", out)
    assert res.rc == 0, res.err
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(out / "model.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
