"""TVM artifacts whose graph has rank-0 (scalar) inputs emit, self-check and run (break-it 9)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tvm_helpers import emit_tvm, run_cli, run_ort

from passctl.ir import from_onnx
from passctl.targets.tvm import load_artifact


def _scale_proto() -> onnx.ModelProto:
    """s[] (scalar), a[2, 3] -> y = a * s [2, 3], z = Neg(s) [] (a rank-0 output too)."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["a", "s"], ["y"], name="mul"),
         helper.make_node("Neg", ["s"], ["z"], name="neg")],
        "g", [helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _if_proto() -> onnx.ModelProto:
    """c[] bool, x[1, 64] -> If(c): Relu(x) else Neg(x) (the trial's bad/if.onnx)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t_out"])], "then", [],
                             [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [1, 64])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [],
                              [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [1, 64])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if0")],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []), x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_scalar_input_and_output_match_onnx_runtime(tmp_path):
    proto = _scale_proto()
    info = emit_tvm(from_onnx(proto), tmp_path / "out", self_check=True)
    assert info["self_check"]["ok"] is True  # the emitter's own run on seeded inputs
    artifact = load_artifact(str(tmp_path / "out"))
    assert [i["shape"] for i in artifact.manifest["inputs"]] == [[], [2, 3]]
    a = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    # a 0-d array, a numpy scalar and a Python float
    for s in (np.array(-1.75, np.float32), np.float32(0.5), 3.0):
        got = artifact.run({"s": s, "a": a})
        want = run_ort(proto, {"s": np.asarray(s, np.float32), "a": a})
        assert got["z"].shape == () and got["y"].shape == (2, 3)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6)
        np.testing.assert_allclose(got["z"], want["z"], rtol=1e-6)


def test_scalar_input_of_another_shape_is_still_refused(tmp_path):
    emit_tvm(from_onnx(_scale_proto()), tmp_path / "out", self_check=False)
    artifact = load_artifact(str(tmp_path / "out"))
    with pytest.raises(ValueError,
                       match=r"input 's' has shape \[1\]; the artifact was built for \[\]"):
        artifact.run({"s": np.ones(1, np.float32), "a": np.ones((2, 3), np.float32)})


def test_if_on_a_scalar_bool_via_the_cli(tmp_path):
    """passctl compile --emit tvm (self-check included) then passctl run --inputs, both branches."""
    proto = _if_proto()
    onnx.save(proto, str(tmp_path / "if.onnx"))
    r = run_cli(tmp_path / "if.onnx", "--emit", "tvm", "-o", tmp_path / "tvm", "-q")
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)
    for cond in (True, False):
        np.savez(tmp_path / "in.npz", c=np.array(cond), x=x)
        r = run_cli("run", tmp_path / "tvm", "--inputs", tmp_path / "in.npz", "--runs", 1,
                    "--save-outputs", tmp_path / "y.npz")
        assert r.returncode == 0, r.stderr
        want = run_ort(proto, {"c": np.array(cond), "x": x})["y"]
        with np.load(tmp_path / "y.npz") as data:
            np.testing.assert_allclose(data["y"], want, rtol=1e-6)
