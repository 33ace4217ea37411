"""``passctl compare ORIGINAL TVM_ARTIFACT`` (issue 19): the outputs from the artifact's own
model.so, intermediates from a debug build of its ir.onnx, paired by the original's names; a
rule loaded with --load that drops LayerNormalization's epsilon (wrong_rules.py) is found.

Every expected number is computed here without passctl.tools.compare: ONNX Runtime on the
original (and on the original with that epsilon dropped by hand), and the artifact's model.so run
through tvm.runtime directly (``_run_library``)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil

import numpy as np
import onnx
import pytest
from compare_helpers import WRONG_RULES, max_rel, run_all_tensors
from onnx import TensorProto, helper, numpy_helper

from passctl.support.inputs import make_inputs
from passctl.tools.cli import main

BOUND = 1e-4
PIPELINE = 'cleanup,fuse,lower-tvm{dims="batch=2"}'
WRONG = 'cleanup,wrong-layernorm,fuse,lower-tvm{dims="batch=2"}'
FLOATS = ["h", "hb", "ln", "t", "m2", "y"]  # the original's float tensors, in graph order


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def _small_model(path) -> onnx.ModelProto:
    """MatMul, Add, LayerNormalization (epsilon 1e-2, so dropping it shows), Tanh, MatMul, Add."""
    rng = np.random.default_rng(3)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
             helper.make_node("LayerNormalization", ["hb", "g", "beta"], ["ln"], name="ln1",
                              axis=-1, epsilon=1e-2),
             helper.make_node("Tanh", ["ln"], ["t"], name="tanh1"),
             helper.make_node("MatMul", ["t", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["m2", "b2"], ["y"], name="add2")]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8])],
        [w("w1", 16, 32), w("b1", 32), w("g", 32), w("beta", 32), w("w2", 32, 8), w("b2", 8)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(proto, path)
    return proto


def _run_library(folder, feeds) -> dict:
    """The artifact's outputs from its model.so, with tvm.runtime alone (not passctl's loader)."""
    import tvm.runtime as rt
    from tvm.runtime.vm import VirtualMachine

    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    dev = rt.cpu(0)
    vm = VirtualMachine(rt.load_module(os.path.join(folder, "model.so")), dev)
    params = rt.load_param_dict_from_file(os.path.join(folder, "model.params"))
    weights = [rt.tensor(params[n].numpy(), dev) for n in manifest["param_names"]]
    if manifest.get("transform_params"):
        weights = list(vm[manifest["transform_params"]](weights))
    args = [rt.tensor(np.ascontiguousarray(feeds[i["name"]], dtype=i["dtype"]), dev)
            for i in manifest["inputs"]]
    out = vm["main"](*args, *weights)
    outs = [out] if hasattr(out, "numpy") else list(out)
    return {o["name"]: t.numpy() for o, t in zip(manifest["outputs"], outs)}


def _drop_epsilon(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with the first LayerNormalization's epsilon removed (ONNX's default 1e-5 applies)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    node = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    keep = [a for a in node.attribute if a.name != "epsilon"]
    assert len(keep) < len(node.attribute)
    del node.attribute[:]
    node.attribute.extend(keep)
    return proto


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The model, its good and its wrong TVM artifact, and the seeded inputs compare uses."""
    tmp = tmp_path_factory.mktemp("tvmcmp")
    proto = _small_model(tmp / "small.onnx")
    for name, pipeline, extra in (("good", PIPELINE, []), ("bad", WRONG, ["--load", WRONG_RULES])):
        rc, _, err = _run([tmp / "small.onnx", "-p", pipeline, *extra, "--emit", "tvm",
                           "-o", tmp / name, "-q"])
        assert rc == 0, err
    feeds = make_inputs(proto, seed=0, dim_values={"batch": 2})
    return tmp, proto, feeds


def _compare(tmp, artifact, *extra):
    out = tmp / f"cmp_{os.path.basename(str(artifact))}_{len(extra)}"
    rc, stdout, stderr = _run(["compare", tmp / "small.onnx", artifact, *extra,
                               "--bound", f"max-rel={BOUND}", "-o", out])
    assert rc == 0, stderr
    with open(out / "compare.json") as f:
        return json.load(f), stdout


def _entry(report, name):
    return next(t for t in report["tensors"] if t["original"] == name)


def test_ir_onnx_is_the_ir_with_its_weights_read_from_model_params(small):
    tmp, proto, _ = small
    folder = tmp / "good"
    assert os.path.getsize(folder / "ir.onnx") < 4096  # no second copy of the weights
    header = onnx.load(str(folder / "ir.onnx"), load_external_data=False)
    stored = {t.name: t for t in header.graph.initializer}
    for name in ("w1", "w2"):  # over 64 elements: TVM parameters, so stored in model.params
        t = stored[name]
        assert t.data_location == TensorProto.EXTERNAL
        assert dict((e.key, e.value) for e in t.external_data)["location"] == "model.params"
    ir = onnx.load(str(folder / "ir.onnx"))  # external data resolved against the folder
    original = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for t in ir.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(t), original[t.name])
    # the nodes keep the original's names (provenance)
    assert {n.name for n in ir.graph.node} >= {"mm1", "mm2", "tanh1"}


def test_outputs_come_from_the_shipped_library(small):
    tmp, proto, feeds = small
    report, stdout = _compare(tmp, tmp / "good")
    want = run_all_tensors(proto, feeds)["y"]
    got = _run_library(tmp / "good", feeds)["y"]
    y = _entry(report, "y")
    assert y["status"] == "paired" and y["candidate"] == "y" and y["source"] == "shipped"
    assert y["max_rel"] == pytest.approx(max_rel(want, got), rel=1e-9, abs=1e-12)
    assert report["tvm"]["shipped"]["outputs"] == ["y"]
    assert "1 output pair(s) from the shipped model.so (tvm.runtime)" in stdout


def test_intermediates_pair_by_the_original_names(small):
    tmp, proto, feeds = small
    report, stdout = _compare(tmp, tmp / "good")
    ref = run_all_tensors(proto, feeds)
    assert [t["original"] for t in report["tensors"]] == FLOATS
    assert report["counts"] == {"float_tensors": 6, "paired": 6, "fused-away": 0, "removed": 0}
    for t in report["tensors"]:
        assert t["status"] == "paired", t
        assert t["shape"] == list(ref[t["original"]].shape)
        # an fp32 build of an fp32 model: every pair agrees with the original to float32 rounding
        assert t["max_rel"] <= 1e-5, t
        if t["original"] != "y":
            assert t["source"] == "debug-build", t
    for name in ("h", "hb", "t", "m2"):  # kept their names through cleanup, fuse and lower-tvm
        assert _entry(report, name)["candidate"] == name
    assert report["tvm"]["debug_build"]["built"] is True
    # the debug build reproduces the shipped library's output
    assert report["tvm"]["debug_vs_shipped"]["y"] <= 1e-6
    assert "5 intermediate pair(s) from a debug build of ir.onnx" in stdout
    assert report["first_jump"] is None


def test_a_wrong_rule_is_found_at_the_first_wrong_tensor(small):
    tmp, proto, feeds = small
    report, stdout = _compare(tmp, tmp / "bad")
    ref = run_all_tensors(proto, feeds)
    bad = run_all_tensors(_drop_epsilon(proto), feeds)
    assert max_rel(ref["ln"], bad["ln"]) > 10 * BOUND  # dropping that epsilon really matters
    assert report["first_jump"] == "ln" and report["first_over_bound"] == "ln"
    assert "first tensor where the error jumps: 'ln' (node 'ln1', LayerNormalization)" in stdout
    ln = _entry(report, "ln")
    assert ln["source"] == "debug-build"
    # the debug build's LayerNorm output is the hand-broken LayerNorm's (float rounding aside)
    assert ln["max_rel"] == pytest.approx(max_rel(ref["ln"], bad["ln"]), rel=1e-2)
    for name in ("h", "hb"):  # before it: within the bound
        assert _entry(report, name)["max_rel"] <= BOUND
    # the shipped library's output carries the error, as ONNX Runtime on the broken model does
    y = _entry(report, "y")
    got = _run_library(tmp / "bad", feeds)["y"]
    assert y["source"] == "shipped"
    assert y["max_rel"] == pytest.approx(max_rel(ref["y"], got), rel=1e-9, abs=1e-12)
    assert y["max_rel"] == pytest.approx(max_rel(ref["y"], bad["y"]), rel=1e-2)


def test_html_page_names_the_source_of_each_pair(small):
    tmp, _, _ = small
    out = tmp / "page"
    rc, _, err = _run(["compare", tmp / "small.onnx", tmp / "bad", "-o", out])
    assert rc == 0, err
    page = (out / "compare.html").read_text()
    assert '<p id="tvm">TVM artifact: 1 output pair(s) from the shipped model.so' in page
    assert "<td>shipped</td>" in page and "<td>debug-build</td>" in page


def test_an_artifact_without_ir_onnx_compares_its_outputs_only(small, tmp_path):
    tmp, proto, feeds = small
    folder = tmp_path / "old"
    shutil.copytree(tmp / "bad", folder)
    os.remove(folder / "ir.onnx")
    out = tmp_path / "cmp"
    rc, stdout, err = _run(["compare", tmp / "small.onnx", folder, "-o", out])
    assert rc == 0, err
    with open(out / "compare.json") as f:
        report = json.load(f)
    assert [t["original"] for t in report["tensors"]] == FLOATS
    assert [t["status"] for t in report["tensors"]] == ["not-exposed"] * 5 + ["paired"]
    got = _run_library(folder, feeds)["y"]
    ref = run_all_tensors(proto, feeds)["y"]
    assert _entry(report, "y")["max_rel"] == pytest.approx(max_rel(ref, got), rel=1e-9)
    assert report["first_jump"] == "y"  # the only tensor it can see
    assert "5 not exposed" in stdout and "has no ir.onnx" in stdout


def test_a_failed_debug_build_leaves_the_outputs_and_says_why(small, tmp_path, monkeypatch):
    from passctl.targets.tvm import debug_build

    def refuse(self, model, manifest):
        raise RuntimeError("TVMError: a stand-in for a build TVM refuses")

    monkeypatch.setattr(debug_build.DebugBuild, "__init__", refuse)
    tmp, _, _ = small
    rc, stdout, err = _run(["compare", tmp / "small.onnx", tmp / "bad", "-o", tmp_path / "c"])
    assert rc == 0, err
    with open(tmp_path / "c" / "compare.json") as f:
        report = json.load(f)
    assert [t["status"] for t in report["tensors"]] == ["not-exposed"] * 5 + ["paired"]
    assert report["tvm"]["debug_build"] == {
        "built": False,
        "reason": "the debug build failed (RuntimeError: TVMError: a stand-in for a build TVM "
                  "refuses)"}
    assert "no intermediates: the debug build failed" in stdout


def test_bad_input_is_one_line(small, tmp_path):
    tmp, _, _ = small
    # inputs of another shape than the artifact was built for
    rc, _, err = _run(["compare", tmp / "small.onnx", tmp / "good", "--dim", "batch=3",
                       "-o", tmp_path / "a"])
    assert rc == 2 and "the inputs do not fit" in err and "[2, 4, 16]" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()
    rc, _, err = _run(["compare", tmp / "small.onnx", tmp / "good", "--pipeline", "cleanup",
                       "-o", tmp_path / "b"])
    assert rc == 2 and "one of them" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_minilm_tvm_artifact_points_at_the_first_wrong_layernorm(tmp_path):
    """MiniLM (tests/corpus.py minilm_legacy) compiled to TVM with the wrong rule: the first
    LayerNormalization is named, by its original name, and the outputs come from model.so."""
    from corpus import corpus_path

    minilm = corpus_path("minilm_legacy")
    dims = 'lower-tvm{dims="batch=1,sequence=16"}'
    rc, _, err = _run([minilm, "-p", f"cleanup,wrong-layernorm,fuse,{dims}", "--load",
                       WRONG_RULES, "--emit", "tvm", "-o", tmp_path / "art", "-q"])
    assert rc == 0, err
    rc, stdout, err = _run(["compare", minilm, tmp_path / "art", "--bound", f"max-rel={BOUND}",
                            "-o", tmp_path / "cmp"])
    assert rc == 0, err
    with open(tmp_path / "cmp" / "compare.json") as f:
        report = json.load(f)
    proto = onnx.load(minilm)
    first = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    name = first.output[0]
    assert report["first_jump"] == name and f"'{name}'" in stdout
    feeds = make_inputs(minilm, seed=0, dim_values={"batch": 1, "sequence": 16})
    ref = run_all_tensors(proto, feeds)
    bad = run_all_tensors(_drop_epsilon(proto), feeds)
    entry = next(t for t in report["tensors"] if t["original"] == name)
    assert entry["source"] == "debug-build"
    assert entry["max_rel"] == pytest.approx(max_rel(ref[name], bad[name]), rel=1e-2)
    got = _run_library(tmp_path / "art", feeds)
    for o in proto.graph.output:
        t = next(t for t in report["tensors"] if t["original"] == o.name)
        assert t["source"] == "shipped"
        assert t["max_rel"] == pytest.approx(max_rel(ref[o.name], got[o.name]), rel=1e-9)
    assert report["counts"]["paired"] > 0.7 * report["counts"]["float_tensors"]
