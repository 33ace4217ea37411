"""docs/writing-a-pass.md's example plugin, run exactly as the page shows, through the CLI."""

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
from cli_helpers import sha256  # tests/cli/cli_helpers.py
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "docs" / "examples" / "my_passes.py"
DOC = REPO / "docs" / "writing-a-pass.md"
CLS_SPEC = "rapidocr_onnxruntime:models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def test_doc_shows_the_example_file_verbatim_in_under_25_lines():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert PLUGIN.read_text() in blocks
    assert len(PLUGIN.read_text().splitlines()) < 25
    # the example shows an alternative (a | b) and a named binding (_name=...)
    assert ") | op." in PLUGIN.read_text() and '_name="add"' in PLUGIN.read_text()


def _ort(path_or_bytes, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_example_rule_on_ppocr_cls(cli, tmp_path):
    from passctl.tools.model_source import resolve_model_path

    src = resolve_model_path(CLS_SPEC)
    digest = sha256(src)
    out = tmp_path / "cls-hardswish"
    r = cli(CLS_SPEC, "--load", PLUGIN, "--pipeline", "cleanup,fuse-conv-bn,fuse-hardswish",
            "--target", "cpu", "--check", "-o", out)
    assert r.rc == 0, r.err
    assert "hardswish-to-hardsigmoid=18" in r.out
    report = json.loads((out / "report.json").read_text())
    (hs,) = [p for p in report["passes"] if p["name"] == "fuse-hardswish"]
    assert hs["stats"] == {"hardswish-to-hardsigmoid": 18} and hs["modified"]
    before, after = report["op_histogram"]["before"], report["op_histogram"]["after"]
    assert before["HardSigmoid"] == 9 and after["HardSigmoid"] == 27
    assert "Clip" not in after and "Div" not in after
    assert report["plugins"] == [{"file": str(PLUGIN), "passes": ["fuse-hardswish"]}]
    # Independent numeric check on a fresh input (seed 11, not the CLI's seed 0).
    x = np.random.default_rng(11).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    (ref,), (got,) = _ort(src, {"x": x}), _ort(str(out / "model.onnx"), {"x": x})
    assert np.max(np.abs(ref - got)) <= 1e-5 * np.max(np.abs(ref))
    assert sha256(src) == digest


def test_explain_and_list_passes_see_the_plugin(cli):
    r = cli("explain", "hardswish-to-hardsigmoid", CLS_SPEC, "--load", PLUGIN)
    assert r.rc == 0, r.err
    assert "18 candidate Div node(s); the rule would fire at 18" in r.out
    r = cli("list-passes", "--load", PLUGIN)
    assert r.rc == 0, r.err
    assert re.search(r"fuse-hardswish\s+rewrite x \* Clip\(x \+ 3, 0, 6\) / 6", r.out)


def test_check_refuses_integer_tensors(cli, tmp_path):
    # The same four ops on int64: the pattern matches, the rule's check refuses with its reason.
    consts = [numpy_helper.from_array(np.array(v, dtype=np.int64), n)
              for n, v in (("three", 3), ("zero", 0), ("six", 6))]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]),
             helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["m"]),
             helper.make_node("Div", ["m", "six"], ["y"])]
    graph = helper.make_graph(nodes, "int_hs",
                              [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [4])], consts)
    path = tmp_path / "int_hs.onnx"
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    r = cli("explain", "hardswish-to-hardsigmoid", path, "--load", PLUGIN)
    assert r.rc == 0, r.err
    assert "the rule would fire at 0" in r.out
    assert "x + 3 is not floating point" in r.out
    out = tmp_path / "out"
    r = cli(path, "--load", PLUGIN, "--pipeline", "fuse-hardswish", "-o", out, "-q")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["passes"][0]["modified"] is False
    assert report["op_histogram"]["after"] == {"Add": 1, "Clip": 1, "Div": 1, "Mul": 1}


def test_example_rule_takes_the_min_relu_alternative(cli, tmp_path):
    # Relu6 written as Min(Relu(x + 3), 6), the operands of Mul and Add swapped: the rule's second
    # alternative (and commute) fuse it; ONNX Runtime gives the same values as the original.
    consts = [numpy_helper.from_array(np.array(v, dtype=np.float32), n)
              for n, v in (("three", 3.0), ("six", 6.0))]
    nodes = [helper.make_node("Add", ["three", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Min", ["r", "six"], ["c"]),
             helper.make_node("Mul", ["c", "x"], ["m"]),
             helper.make_node("Div", ["m", "six"], ["y"])]
    graph = helper.make_graph(nodes, "min_relu_hs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], consts)
    path = tmp_path / "min_relu_hs.onnx"
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    out = tmp_path / "out"
    r = cli(path, "--load", PLUGIN, "--pipeline", "fuse-hardswish,dce", "-o", out, "-q")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["passes"][0]["stats"] == {"hardswish-to-hardsigmoid": 1}
    assert report["op_histogram"]["after"] == {"HardSigmoid": 1, "Mul": 1}
    x = np.random.default_rng(5).uniform(-6, 6, (2, 16)).astype(np.float32)
    (ref,), (got,) = _ort(str(path), {"x": x}), _ort(str(out / "model.onnx"), {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert np.any(ref == 0) and np.any(ref == x)  # both saturated ends of Relu6 were hit
