"""``passctl opt``: IR text out for .pir and .onnx input, the same text from the installed entry
point, and one-line errors (exit 2 for the user's mistakes, 3 for a pass that raises)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from golden_files import GOLDEN_DIR, read_golden, run_argv, run_opt
from onnx import TensorProto, helper, numpy_helper

from passctl.ir import parse_model
from passctl.tools.cli import main

DCE = GOLDEN_DIR / "cleanup" / "dce.pir"


def _run(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_entry_point_prints_what_the_golden_test_compares():
    """``python -m passctl.tools.cli opt`` in a new process writes the same text as the in-process
    run the golden test uses (printing is deterministic), and nothing on stderr."""
    golden = read_golden(GOLDEN_DIR / "fuse-conv-bn" / "conv_bn.pir")
    proc = subprocess.run([sys.executable, "-m", "passctl.tools.cli", *run_argv(golden)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == run_opt(golden)
    conv, = parse_model(proc.stdout).graph
    assert conv.op_type == "Conv" and conv.provenance == ("conv", "bn")


def test_onnx_input_is_read_and_printed_as_ir_text(tmp_path, capsys):
    w = np.array([[[[0.5]], [[-1.0]]], [[[2.0]], [[0.25]]]], np.float32)
    inits = [numpy_helper.from_array(w, "w")] + [
        numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("s", [1.5, 0.75]), ("b", [-0.3, 0.4]), ("m", [0.2, -0.1]), ("v", [2.0, 0.5]))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3, 3])], inits)
    path = tmp_path / "conv_bn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rc, out, err = _run(capsys, "opt", path, "-p", "fuse-conv-bn,dce")
    assert (rc, err) == (0, "")
    model = parse_model(out)
    assert [n.op_type for n in model.graph] == ["Conv"]
    folded = next(v for v in model.graph.initializers.values() if v.const.dims == (2, 2, 1, 1))
    scale = np.array([1.5, 0.75]) / np.sqrt(np.array([2.0, 0.5]) + 1e-5)  # BN's default epsilon
    np.testing.assert_allclose(folded.const.numpy(), w * scale[:, None, None, None], rtol=1e-6)


def test_no_final_dce_the_output_is_exactly_the_pipeline(capsys):
    """Unlike compile, opt adds no dce: fold-constants alone leaves the folded-away inputs."""
    rc, out, _ = _run(capsys, "opt", GOLDEN_DIR / "cleanup" / "fold_constants.pir", "-p",
                      "fold-constants")
    assert rc == 0
    assert len(parse_model(out).graph.initializers) == 5  # a, k, s, t and the folded shape


def test_help_lists_opt(capsys):
    rc, out, _ = _run(capsys, "--help")
    assert rc == 0 and "opt run a pipeline on IR text (or ONNX) and print the IR text after it" in \
        " ".join(out.split())


@pytest.mark.parametrize("argv,message", [
    (["-p", "dce,no-such-pass"], "pipeline 'dce,no-such-pass', column 5: unknown pass 'no-such-pass'"),
    (["-p", "  "], "the pipeline is empty"),
    (["-p", "dce", "--target", "tpu"], "unknown target 'tpu'"),
    (["-p", "dce", "--emit", "nope"], "unknown emitter 'nope'"),
    ([], "the following arguments are required: --pipeline/-p"),
])
def test_bad_arguments_are_one_line_exit_2(capsys, argv, message):
    rc, out, err = _run(capsys, "opt", DCE, *argv)
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("passctl: error: ") and message in err


def test_missing_file_is_one_line_exit_2(tmp_path, capsys):
    rc, out, err = _run(capsys, "opt", tmp_path / "nope.pir", "-p", "dce")
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and f"model file '{tmp_path / 'nope.pir'}' not found" in err


def test_parse_error_names_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "bad.pir"
    path.write_text(DCE.read_text().replace("Add(%live, %live)", "Add(%live, %nope)"))
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "%nope" in ln)
    rc, out, err = _run(capsys, "opt", path, "-p", "dce")
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1
    assert f"{path}:{line}:" in err and "value '%nope' is not defined before this use" in err


def test_invalid_model_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "arity.pir"
    path.write_text(DCE.read_text().replace("Relu(%x)", "Relu(%x, %x)"))
    rc, out, err = _run(capsys, "opt", path, "-p", "dce")
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and "invalid model: arity:" in err and "passctl verify" in err


def test_a_pass_that_raises_is_one_line_exit_3(tmp_path, capsys):
    plugin = tmp_path / "crash.py"
    plugin.write_text(
        "from passctl.passes import Pass, register_pass\n\n\n"
        "@register_pass(replace=True)\nclass Crash(Pass):\n    name = 'golden-crash'\n"
        "    summary = 'raises'\n\n    def run(self, model):\n        raise RuntimeError('boom')\n")
    from passctl.passes import registry

    try:
        rc, out, err = _run(capsys, "opt", DCE, "-p", "dce,golden-crash", "--load", plugin)
    finally:
        registry.unregister_pass("golden-crash")
    assert (rc, out) == (3, "")
    assert err == ("passctl: internal error: pass 'golden-crash' failed after passes [dce]: "
                   "RuntimeError: boom\n")


def test_verify_each_runs_the_verifier_after_each_pass(capsys):
    rc, out, err = _run(capsys, "opt", DCE, "-p", "cleanup", "--verify-each")
    assert (rc, err) == (0, "")
    assert [n.op_type for n in parse_model(out).graph] == ["Relu", "Add"]
