"""Option values that make no sense are one-line user errors before any work (break-it 6, 11)."""

from __future__ import annotations

import json

import numpy as np
import pytest


def _assert_user_error(r, *words):
    """rc 2, one ``passctl: error:`` line naming ``words``, no traceback."""
    assert r.rc == 2, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("passctl: error: "), r.err
    assert "Traceback" not in r.err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("option,value", [("--rtol", "-1"), ("--rtol", "nan"), ("--rtol", "inf"),
                                          ("--atol", "-0.001"), ("--atol", "nan")])
def test_bad_tolerance_is_exit_2(cli, conv_bn_model, tmp_path, option, value):
    r = cli(conv_bn_model, "--check", option, value, "-o", tmp_path / "o", "-q")
    _assert_user_error(r, option, value, ">= 0")
    assert not (tmp_path / "o").exists()


def test_zero_tolerances_are_accepted(cli, tmp_path):
    # x -> Relu -> y: neither passctl's cleanup nor ONNX Runtime's ORT_ENABLE_ALL (which the check
    # runs an onnxruntime artifact with, as session.json ships it) rewrites it: errors are exactly 0
    # (the Conv+BN model is folded by ONNX Runtime itself: max_rel 1.07e-07)
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    r = cli(model, "--check", "--rtol", "0", "--atol", "0", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err


def test_negative_seed_is_exit_2(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--check", "--seed", "-1", "-o", tmp_path / "o", "-q")
    _assert_user_error(r, "--seed", "-1", ">= 0")
    assert not (tmp_path / "o").exists()


def test_negative_seed_in_run_is_exit_2(cli, conv_bn_model, tmp_path):
    assert cli(conv_bn_model, "-o", tmp_path / "art", "-q").rc == 0
    r = cli("run", tmp_path / "art", "--seed", "-3", "--runs", "1")
    _assert_user_error(r, "seed", "-3", ">= 0")


@pytest.mark.parametrize("text", ["", "  "])
def test_empty_pipeline_is_exit_2(cli, conv_bn_model, tmp_path, text):
    r = cli(conv_bn_model, "-p", text, "-o", tmp_path / "o", "-q")
    _assert_user_error(r, "--pipeline", "empty", "list-passes")
    assert not (tmp_path / "o").exists()


def test_inputs_without_check_is_exit_2(cli, conv_bn_model, tmp_path):
    feeds = tmp_path / "x.npz"
    np.savez(feeds, x=np.zeros((1, 3, 8, 8), np.float32))
    r = cli(conv_bn_model, "--inputs", feeds, "-o", tmp_path / "o", "-q")
    _assert_user_error(r, "--inputs", "--check")
    assert not (tmp_path / "o").exists()
    r = cli(conv_bn_model, "--inputs", feeds, "--check-each", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err


def test_dim_without_check_is_exit_2(cli, tmp_path):
    """--dim sizes only the check's inputs: without --check it would be ignored silently."""
    import onnx
    import onnx.helper as oh

    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])])
    path = tmp_path / "dyn.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), str(path))
    r = cli(path, "--dim", "batch=2", "-o", tmp_path / "o", "-q")
    _assert_user_error(r, "--dim batch=2 sizes only the numeric check's inputs",
                       "lower-tvm{dims=...}")
    assert not (tmp_path / "o").exists()
    r = cli(path, "--dim", "batch=2", "--check", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    check = json.loads((tmp_path / "o" / "report.json").read_text())["check"]
    assert check["inputs"][0]["shape"] == [2, 4]


@pytest.mark.parametrize("pipeline", ["fold-constants{size_limit=-5}", "cleanup{size_limit=-5}"])
def test_negative_fold_size_limit_is_exit_2(cli, conv_bn_model, tmp_path, pipeline):
    r = cli(conv_bn_model, "-p", pipeline, "-o", tmp_path / "o", "-q")
    _assert_user_error(r, "fold-constants", "size_limit=-5", ">= 0")
    assert not (tmp_path / "o").exists()


def test_fold_size_limit_zero_folds_nothing_but_lifts(cli, tmp_path):
    """size_limit=0 is valid: Constant nodes are lifted, no computed result is small enough."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], ["c"], name="c0",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 4.0])),
             helper.make_node("Sqrt", ["c"], ["s"], name="sqrt0"),
             helper.make_node("Add", ["x", "s"], ["y"], name="add0")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    r = cli(path, "-p", "fold-constants{size_limit=0}", "--check", "-o", tmp_path / "o", "-q")
    assert r.rc == 0, r.err
    out = onnx.load(str(tmp_path / "o" / "model.onnx"))
    assert [n.op_type for n in out.graph.node] == ["Sqrt", "Add"]


@pytest.mark.parametrize("option, message", [
    ("budget=-1", "amp: budget=-1 must be a positive error"),
    ("budget=nan", "amp: budget=nan must be a positive error"),
    ("budget=0", "amp: budget=0 must be a positive error"),
    ("samples=0", "amp: samples=0 must be at least 1"),
])
def test_bad_amp_options_are_exit_2(cli, conv_bn_model, tmp_path, option, message):
    """A negative or NaN budget used to keep every measured node float32 with only a warning."""
    r = cli(conv_bn_model, "-p", f"cleanup,amp{{{option}}}", "--target", "a10", "-o", tmp_path / "o")
    _assert_user_error(r, message)
    assert not (tmp_path / "o").exists()
