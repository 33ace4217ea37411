"""The verify run of every compile: a broken artifact is never published, even without --check.

Each test loads a test-only pass (written to a file and given with --load, as a user's plugin is)
that breaks the artifact the way one class of issue 15's bugs did, and shows that the compile
exits 3, publishes no output folder, and names that pass; --no-verify skips the run."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passctl.support.check import run_onnxruntime
from passctl.tools.cli import main

PLUGIN = textwrap.dedent('''
    import numpy as np
    from passctl.ir import Node, Shape, TensorType
    from passctl.passes.base import Pass, PassResult
    from passctl.passes.registry import register_pass


    def _first(graph, op):
        return next(n for n in graph if n.op_type == op)


    def _reshape_before(graph, node, dims, name):
        shape = graph.add_constant(np.array(dims, np.int64), name + "_shape")
        r = Node("", "Reshape", [node.inputs[0], shape], name=name)
        graph.insert_before(node, r)
        node.set_input(0, r.outputs[0])


    @register_pass(replace=True)
    class DropRank(Pass):
        """A rewrite that loses the leading axis (issue 15 bug 3: a fused op drops a rank)."""
        name = "test-drop-rank"
        summary = "test only: Reshape the Relu input to lose axis 0"

        def run(self, model):
            x = _first(model.graph, "Relu").inputs[0]
            _reshape_before(model.graph, _first(model.graph, "Relu"), list(x.shape.dims[1:]),
                            "dropped")
            return PassResult(True, {"broken": 1})


    @register_pass(replace=True)
    class DropRankAndDeclare(Pass):
        """As test-drop-rank, and it also rewrites the declared output shape to match (a stale or
        wrongly updated declaration that no longer says what the original returns)."""
        name = "test-drop-rank-declared"
        summary = "test only: drop a rank and declare the new shape"

        def run(self, model):
            relu = _first(model.graph, "Relu")
            dims = list(relu.inputs[0].shape.dims[1:])
            _reshape_before(model.graph, relu, dims, "dropped")
            for v in model.graph.outputs:
                v.type = TensorType(v.dtype, Shape(tuple(dims)))
            return PassResult(True, {"broken": 1})


    @register_pass(replace=True)
    class Unrunnable(Pass):
        """A node that loads (the batch is symbolic) but fails at run time (issue 15 bug 1: a
        lowering that breaks the kernel's constraints)."""
        name = "test-unrunnable"
        summary = "test only: Reshape to a size the input does not have"

        def run(self, model):
            _reshape_before(model.graph, _first(model.graph, "Relu"), [3, -1], "bad_reshape")
            return PassResult(True, {"broken": 1})


    @register_pass(replace=True)
    class MakeNaN(Pass):
        """Relu -> Log: NaN where the original is finite (issue 15 bug 2: wrong values)."""
        name = "test-nan"
        summary = "test only: turn Relu into Log"

        def run(self, model):
            _first(model.graph, "Relu").op_type = "Log"
            return PassResult(True, {"broken": 1})


    @register_pass(replace=True)
    class WrongType(Pass):
        """A Cast to float16 before the output, declared float32 (an artifact that does not
        load)."""
        name = "test-wrong-type"
        summary = "test only: Cast the Relu input to float16"

        def run(self, model):
            relu = _first(model.graph, "Relu")
            c = Node("", "Cast", [relu.inputs[0]], {"to": 10}, name="to_half")
            model.graph.insert_before(relu, c)
            relu.set_input(0, c.outputs[0])
            return PassResult(True, {"broken": 1})
''')


def _cli(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _model(tmp_path, batch="N") -> str:
    """x[batch, 4] -> Mul(w) -> Relu -> y[batch, 4] (w: seeded, both signs)."""
    w = np.random.default_rng(1).standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["m"], name="mul0"),
         helper.make_node("Relu", ["m"], ["y"], name="relu0")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    return path


@pytest.fixture
def plugin(tmp_path) -> str:
    path = tmp_path / "breakers.py"
    path.write_text(PLUGIN)
    return str(path)


def _nothing_published(tmp_path, out) -> None:
    assert not out.exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(f".{out.name}.")]


@pytest.mark.parametrize("broken, said", [
    ("test-drop-rank", "output 'y' of the artifact has shape [4] where the original's is [1, 4]"),
    ("test-drop-rank-declared", "output 'y' of the artifact has shape [4] where the original's is "
                                "[1, 4]"),
    ("test-unrunnable", "the artifact fails in onnxruntime ORT_ENABLE_ALL on seeded inputs (x [1, 4])"),
    ("test-nan", "output 'y' of the artifact is NaN or infinite at"),
    ("test-wrong-type", "ONNX Runtime cannot load the emitted model"),
])
def test_a_broken_artifact_is_not_published_without_check(capsys, tmp_path, plugin, broken, said):
    model, out, repro = _model(tmp_path), tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, model, "--load", plugin, "-p", f"cleanup,{broken}", "-o", out,
                      "--reproducer-dir", repro, "-q")
    assert rc == 3, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("passctl: internal error: ") and said in lines[0], err
    assert f"pass '{broken}'" in lines[0], err  # names the pass that broke it
    assert lines[1].startswith("passctl: reproducer: ") and len(lines) == 2
    folder = lines[1].split(": ", 2)[2]
    assert folder.startswith(str(repro)) and os.path.isfile(os.path.join(folder, "model.pir"))
    _nothing_published(tmp_path, out)


def test_a_tvm_library_is_verified_in_tvm_runtime(capsys, tmp_path, plugin):
    """--emit tvm: the built library runs in tvm.runtime; a dropped rank is caught there too, and
    the reproducer keeps the library."""
    model, out, repro = _model(tmp_path, batch=1), tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, model, "--load", plugin, "-p", "cleanup,test-drop-rank", "--emit",
                      "tvm", "-o", out, "--reproducer-dir", repro, "-q")
    assert rc == 3, err
    assert "output 'y' of the artifact has shape [4] where the original's is [1, 4]" in err
    assert "pass 'test-drop-rank'" in err
    folder = err.strip().splitlines()[1].split(": ", 2)[2]
    assert {"model.so", "manifest.json", "report.json"} <= set(os.listdir(folder))
    assert json.loads(open(os.path.join(folder, "report.json")).read())["verify"]["ok"] is False
    _nothing_published(tmp_path, out)
    rc, _, err = _cli(capsys, model, "-p", "cleanup", "--emit", "tvm", "-o", out, "-q")
    assert rc == 0, err
    verify = json.loads((out / "report.json").read_text())["verify"]
    assert verify["ran"] is True and verify["runtime"] == "tvm"
    assert verify["outputs"] == [{"name": "y", "shape": [1, 4], "dtype": "float32"}]


def test_the_verify_failure_keeps_the_candidate_and_the_report(capsys, tmp_path, plugin):
    out, repro = tmp_path / "out", tmp_path / "repro"
    rc, _, err = _cli(capsys, _model(tmp_path), "--load", plugin, "-p", "cleanup,test-drop-rank", "-o",
                      out, "--reproducer-dir", repro, "-q")
    assert rc == 3
    folder = err.strip().splitlines()[1].split(": ", 2)[2]
    report = json.loads(open(os.path.join(folder, "report.json")).read())
    assert report["verify"]["ok"] is False and "test-drop-rank" in report["verify"]["error"]
    candidate = os.path.join(folder, "model.onnx")
    x = np.ones((1, 4), np.float32)  # the kept candidate really returns the wrong shape
    assert run_onnxruntime(candidate, {"x": x})["y"].shape == (4,)


def test_no_verify_ships_what_verify_would_refuse(capsys, tmp_path, plugin):
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, _model(tmp_path), "--load", plugin, "-p", "cleanup,test-drop-rank",
                      "--no-verify", "-o", out, "-q")
    assert rc == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["verify"] == {"ran": False, "reason": "--no-verify"}
    x = np.ones((1, 4), np.float32)
    assert run_onnxruntime(str(out / "model.onnx"), {"x": x})["y"].shape == (4,)  # broken


def test_a_good_artifact_is_verified_and_the_report_says_how(capsys, tmp_path):
    model, out = _model(tmp_path), tmp_path / "out"
    rc, _, err = _cli(capsys, model, "-p", "cleanup", "-o", out, "-q")
    assert rc == 0, err
    report = json.loads((out / "report.json").read_text())
    verify = report["verify"]
    assert verify["ran"] is True and verify["runtime"] == "onnxruntime ORT_ENABLE_ALL"
    assert verify["inputs"] == [{"name": "x", "shape": [1, 4], "dtype": "float32"}]
    want = run_onnxruntime(model, {"x": np.zeros((1, 4), np.float32)})["y"]
    assert verify["outputs"] == [{"name": "y", "shape": list(want.shape), "dtype": "float32"}]
    assert verify["ms"] > 0 and report["timing"]["verify_s"] >= 0
    assert list(report).index("verify") == list(report).index("check") + 1


def test_a_declaration_the_original_breaks_too_is_corrected_not_refused(capsys, tmp_path):
    """ReduceMean(keepdims=0) over every axis returns a scalar where [1] is declared: the
    original's own declaration is wrong; infer-shapes (in cleanup) replaces the declaration it
    proves wrong, so the artifact declares what it returns and the verify run passes."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = str(tmp_path / "mean.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert run_onnxruntime(path, {"x": np.ones((1, 8), np.float32)})["y"].shape == ()
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, path, "-o", out, "-q")
    assert rc == 0, err
    verify = json.loads((out / "report.json").read_text())["verify"]
    assert verify["ran"] is True and verify["outputs"][0]["shape"] == []
    declared = onnx.load(str(out / "model.onnx")).graph.output[0].type.tensor_type.shape
    assert len(declared.dim) == 0  # the corrected declaration: rank 0, as ONNX Runtime returns
    assert "notes" not in verify


def test_a_declaration_the_original_breaks_too_is_noted_when_nothing_corrects_it(capsys, tmp_path):
    """The same model through -p dce (no infer-shapes): the artifact keeps the original's wrong
    declaration and returns what the original returns, so it ships, with a note."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = str(tmp_path / "mean.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, path, "-p", "dce", "-o", out, "-q")
    assert rc == 0, err
    verify = json.loads((out / "report.json").read_text())["verify"]
    assert verify["ran"] is True and verify["outputs"][0]["shape"] == []
    assert verify["notes"] == ["output 'y' has rank 0 (shape []) where rank 1 ([1]) is declared, "
                               "as the original's does"]


def test_an_original_that_fails_on_the_seeded_inputs_is_not_passctls_error(capsys, tmp_path):
    """x[n] -> Reshape(x, [5, -1]): the default n (16) does not fit the original either, so the
    verify run cannot judge and says why; the compile succeeds."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, None])],
        [numpy_helper.from_array(np.array([5, -1], np.int64), "s")])
    path = str(tmp_path / "r.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(Exception):  # the original really fails at n = 16
        run_onnxruntime(path, {"x": np.zeros(16, np.float32)})
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, path, "-o", out, "-q")
    assert rc == 0, err
    verify = json.loads((out / "report.json").read_text())["verify"]
    assert verify["ran"] is False and "the original fails on the seeded inputs too" in \
        verify["reason"]


def test_the_touch_recorder_blames_the_latest_pass_upstream():
    from passctl.ir import Graph, Model, Node, Value
    from passctl.tools.verify_artifact import TouchRecorder

    x = Value("x")
    a = Node("", "Relu", [x], name="a")
    b = Node("", "Neg", [a.outputs[0]], name="b")
    graph = Graph([x], [b.outputs[0]])
    graph.extend([a, b])
    model = Model(graph, {"": 17})

    class P:
        def __init__(self, name):
            self.name = name

    rec = TouchRecorder()
    rec.on_start(model, [])
    rec.after_pass(P("noop"), model, None)
    assert rec.blame(b) == (None, None)
    a.op_type = "Sigmoid"
    rec.after_pass(P("first"), model, None)
    assert rec.blame(b) == ("first", a)  # b untouched: the latest pass upstream
    b.set_attr("alpha", 1.0)
    rec.after_pass(P("second"), model, None)
    assert rec.blame(b) == ("second", b) and rec.pass_of(a) == "first"


def test_check_reuses_the_verify_runs_original(capsys, tmp_path, monkeypatch):
    """With --check on the same seeded inputs, the original runs once for both."""
    import passctl.support.check as check_module

    model, runs = _model(tmp_path), []
    real = check_module.run_onnxruntime

    def counting(path, inputs, **kw):
        runs.append(str(path))
        return real(path, inputs, **kw)

    monkeypatch.setattr(check_module, "run_onnxruntime", counting)
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, model, "-p", "cleanup", "--check", "-o", out, "-q")
    assert rc == 0, err
    assert runs.count(model) == 1, runs
    report = json.loads((out / "report.json").read_text())
    assert report["verify"]["ran"] and report["check"]["ok"]
    assert report["check"]["inputs"] == report["verify"]["inputs"]
