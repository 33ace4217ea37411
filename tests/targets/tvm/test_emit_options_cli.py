"""``--emit 'tvm{...}'`` options and the TVM emitter's early refusals, through the CLI (no GPU here)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm_helpers import run_cli

from passctl.ir.errors import UserError
from passctl.targets import get_emitter


def _model(path):
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_emit_options_are_typed():
    emitter = get_emitter("tvm{kernels=tvm, fp32_precision='tf32x3', cuda_graph=false, tune=none}")
    assert (emitter.kernels, emitter.fp32_precision, emitter.cuda_graph, emitter.tune) == \
        ("tvm", "tf32x3", False, None)
    assert get_emitter("tvm").cuda_graph is True and get_emitter("tvm").tensorize is False
    assert get_emitter("tvm{tune=auto}").tune is None and get_emitter("tvm{tune=true}").tune is True


@pytest.mark.parametrize("text,message", [
    ("tvm{cuda_graph}", r"option 'cuda_graph' needs a value \(cuda_graph=VALUE\)"),
    ("tvm{kernel=triton}", r"unknown tvm emitter option 'kernel'; known: schedule, .*cuda_graph"),
    ("tvm{cuda_graph=maybe}", r"option cuda_graph='maybe' must be true or false"),
    ("tvm{kernels=triton}}", r"one pair of braces at the end"),
    ("tvm{kernels=triton", r"one pair of braces at the end"),
    ("tvm{cuda_graph=false,cuda_graph=true}", r"option 'cuda_graph' is given twice"),
    ("tvm{kernels=cublas}", r"^--emit 'tvm\{kernels=cublas\}': TVM emitter kernels='cublas': use "
                            r"'auto', 'triton' or 'tvm'$"),
    ("tvm{fp32_precision=fp64}", r"fp32_precision='fp64': use 'ieee', 'tf32' or 'tf32x3'"),
    ('tvm{kernels="tvm,triton}', r"""^--emit 'tvm\{kernels="tvm,triton\}': unterminated "-quoted """),
    ("tvm{cuda_graph=false, kernels='tvm}", r"^--emit 'tvm\{cuda_graph=false, kernels='tvm\}': "
                                           r"unterminated '-quoted value"),
])
def test_bad_emit_options_are_one_line_errors(text, message):
    with pytest.raises(UserError, match=message) as info:
        get_emitter(text)
    assert "\n" not in str(info.value)


def test_emit_quoted_value_keeps_its_commas():
    """A comma inside quotes belongs to the value (it used to split the option in two): the
    emitter sees the whole kernels value, and the options around it are still parsed."""
    for text in ('tvm{cuda_graph=false, kernels="tvm,triton", tune=true}',
                 "tvm{cuda_graph=false,kernels='tvm,triton',tune=true}"):
        with pytest.raises(UserError, match=r"TVM emitter kernels='tvm,triton': use 'auto'"):
            get_emitter(text)
    emitter = get_emitter("tvm{fp32_precision='tf32',cuda_graph=false}")  # unchanged without commas
    assert (emitter.fp32_precision, emitter.cuda_graph, emitter.kernels) == ("tf32", False, "auto")


def test_split_outside_quotes():
    from passctl.passes.option_text import split_outside_quotes

    assert split_outside_quotes("""a=1,b="x,y",c='p,"q',d""") == ["a=1", 'b="x,y"', """c='p,"q'""", "d"]
    assert split_outside_quotes("a,,b") == ["a", "", "b"] and split_outside_quotes("") == [""]
    with pytest.raises(ValueError, match="unterminated '-quoted value"):
        split_outside_quotes("a='b,c")


def test_cli_refuses_before_the_pipeline(tmp_path):
    """kernels=triton for the CPU and --check of an h200 artifact on a machine without a GPU are
    refused before any pass runs (exit 2, one line, nothing written)."""
    _model(tmp_path / "m.onnx")
    r = run_cli(tmp_path / "m.onnx", "-t", "cpu", "--emit", "tvm{kernels=triton}", "-o", tmp_path / "a")
    assert r.returncode == 2 and "kernels=triton is for GPU targets" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "a").exists()
    r = run_cli(tmp_path / "m.onnx", "-t", "h200", "--emit", "tvm", "--check", "-o", tmp_path / "b")
    assert r.returncode == 2 and "no CUDA device" in r.stderr and "passctl run OUT" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


def test_gpu_artifact_without_a_device_is_a_user_error(tmp_path):
    """An h200 artifact cross-compiled here: `passctl run` says it needs a CUDA device (exit 2,
    one line) instead of TVM's 'loader of that name is not registered' traceback."""
    _model(tmp_path / "m.onnx")
    r = run_cli(tmp_path / "m.onnx", "-t", "h200", "--emit", "tvm{cuda_graph=false}", "-q",
                "-o", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["cuda_graph"] is False
    assert manifest["fp32_precision"] == "ieee" and manifest["kernels"] == "tvm"
    r = run_cli("run", tmp_path / "a")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "a cuda artifact (target h200, sm_90) needs cuda device 0" in lines[0]


def test_gpu_only_options_for_cpu_are_warnings(tmp_path):
    _model(tmp_path / "m.onnx")
    r = run_cli(tmp_path / "m.onnx", "-t", "cpu", "--emit",
                "tvm{fp32_precision=tf32,cuda_graph=false,tensorize=true}", "-o", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    assert "fp32_precision=tf32 applies to Triton kernels on GPU targets; ignored" in r.stderr
    assert "tensorize=true, cuda_graph=false only apply to GPU targets; ignored" in r.stderr


def test_lower_tvm_dims_given_twice_is_an_error(tmp_path):
    from passctl.support.dims import parse_dims

    with pytest.raises(UserError, match=r"dims name 'seq' is given twice \(8 and 9\)"):
        parse_dims("batch=1,seq=8,seq=9")
    assert parse_dims("batch=1, x[2]=48") == {"batch": 1, "x[2]": 48}


def test_lower_tvm_axis_out_of_range_says_so():
    from passctl.ir import from_onnx
    from passctl.support.dims import check_dims

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4, 4])])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(UserError, match=r"dims item 'x\[4\]=2': input 'x' has rank 4, so its axes "
                                        r"are 0..3"):
        check_dims(model, {"x[4]": 2})
    check_dims(model, {"x[0]": 2, "n": 2})  # both forms of the symbolic batch are accepted


def test_tensorize_with_an_fp16_matmul_is_refused_before_tvm_crashes(tmp_path):
    """tensorize=true would send an fp16 matmul to DLight's WMMA rule, which segfaults in TVM 0.27
    (docs/tvm.md): a one-line UserError before the build, nothing written."""
    from passctl.ir import from_onnx
    from passctl.targets import get_target
    from passctl.targets.tvm import TvmEmitter

    w = numpy_helper.from_array(np.ones((768, 64), np.float16), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [32, 768])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [32, 64])], [w])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(UserError, match=r"tensorize=true would hand TVM 0.27 a float16 matmul "
                                        r"\(\[32, 768\] x \[768, 64\]\).*tensorize=false") as info:
        TvmEmitter(tensorize=True, kernels="tvm").emit(model, get_target("h200"), str(tmp_path / "a"))
    assert "\n" not in str(info.value) and not (tmp_path / "a").exists()


def test_failed_check_under_python_m_is_a_check_failure_not_an_internal_error(tmp_path):
    """`python -m passctl.tools.cli` ran cli.py as __main__, whose CheckFailed was another class
    than the one compile.py raises: a failed --check printed 'internal error: CheckFailed'."""
    # a --load pass that is wrong on purpose (Tanh -> Sigmoid): a real check failure (a tight
    # --rtol alone no longer fails: the float64 judge finds TVM's transcendental functions as
    # close to the exact answer as ONNX Runtime's)
    (tmp_path / "wrong.py").write_text(
        "from passctl.passes.base import Pass, PassResult\n"
        "from passctl.passes.registry import register_pass\n\n\n"
        "@register_pass\n"
        "class TanhToSigmoid(Pass):\n"
        "    name = 'tanh-to-sigmoid'\n"
        "    summary = 'Tanh -> Sigmoid (WRONG on purpose)'\n\n"
        "    def run(self, model):\n"
        "        hit = [n for n in model.graph if n.op_type == 'Tanh']\n"
        "        for n in hit:\n"
        "            n.op_type = 'Sigmoid'\n"
        "        return PassResult(bool(hit), {'changed': len(hit)})\n")
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Exp", ["x"], ["p"]),
             helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["e", "p"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = run_cli(tmp_path / "m.onnx", "--load", tmp_path / "wrong.py", "-p", "tanh-to-sigmoid",
                "--emit", "tvm", "--check", "-o", tmp_path / "a", "--reproducer-dir", tmp_path / "crash")
    assert r.returncode == 3
    assert r.stderr.startswith("passctl: numeric check failed: output y"), r.stderr
    assert "internal error" not in r.stderr and not (tmp_path / "a").exists()


def test_check_of_an_onnxruntime_artifact_uses_the_dims_lower_tvm_fixed(tmp_path):
    """lower-tvm{dims=...} then --emit onnxruntime --check: the check fed the original's symbolic
    dims a default size the fixed candidate rejected (internal error); it now uses the fixed ones."""
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((16, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    r = run_cli(tmp_path / "m.onnx", "-p", 'lower-tvm{dims="batch=1,seq=8"}', "--emit", "onnxruntime",
                "--check", "-o", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["check"]["ok"] is True
    assert report["check"]["inputs"] == [{"name": "x", "shape": [1, 8, 16], "dtype": "float32"}]
