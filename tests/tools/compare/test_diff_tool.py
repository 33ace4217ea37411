"""``passctl diff``: node-by-node changes matched through provenance, not names."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from passctl.ir.printer import print_model
from passctl.tools.model_source import load_model


def _model(path) -> None:
    """x -> Conv(w, b) -> BatchNormalization -> Relu -> Mul(k, alpha-like) -> y (named nodes)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")] + [
        numpy_helper.from_array(rng.uniform(0.5, 2, 4).astype(np.float32), n)
        for n in ("scale", "bias", "mean", "var")] + [
        numpy_helper.from_array(np.array(0.5, np.float32), "k")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"],
                              name="bn", epsilon=1e-3),
             helper.make_node("LeakyRelu", ["n"], ["r"], name="act", alpha=0.1),
             helper.make_node("Mul", ["r", "k"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_renamed_node_is_matched_by_provenance_and_its_attribute_change_listed(cli, tmp_path):
    a = tmp_path / "a.onnx"
    _model(a)
    model, _ = load_model(str(a))
    act = next(n for n in model.graph if n.op_type == "LeakyRelu")
    act.name = "renamed_activation"          # provenance stays ("act",)
    act.set_attr("alpha", 0.2)
    b = tmp_path / "b.pir"
    b.write_text(print_model(model))
    res = cli("diff", a, b, "--json", tmp_path / "d.json")
    assert res.rc == 0, res.err
    lines = [l for l in res.out.splitlines() if l[:1] in "~*-+"]
    assert lines == ["~ changed   LeakyRelu 'act' -> LeakyRelu 'renamed_activation' "
                     "[alpha: 0.1 -> 0.2]  (from act)"]
    with open(tmp_path / "d.json") as f:
        counts = json.load(f)["counts"]
    assert counts == {"unchanged": 3, "changed": 1}


def test_two_dump_steps_show_the_conv_bn_fusion_as_one_rewrite(cli, tmp_path):
    a = tmp_path / "a.onnx"
    _model(a)
    dump = tmp_path / "dump"
    res = cli(a, "-p", "fuse-conv-bn", "--dump-ir", dump, "-o", tmp_path / "out", "-q")
    assert res.rc == 0, res.err
    res = cli("diff", dump / "000_input.pir", dump / "001_fuse-conv-bn.pir", "--json",
              tmp_path / "d.json")
    assert res.rc == 0, res.err
    with open(tmp_path / "d.json") as f:
        changes = json.load(f)["changes"]
    rewritten = [c for c in changes if c["kind"] != "unchanged"]
    assert len(rewritten) == 1
    assert rewritten[0]["before"] == ["Conv 'conv'", "BatchNormalization 'bn'"]
    assert len(rewritten[0]["after"]) == 1 and rewritten[0]["after"][0].startswith("Conv")
    assert rewritten[0]["provenance"] == ["conv", "bn"]
    # the compiled artifact against the original: compare pairs the fused Conv's output with
    # the BatchNormalization's, and reports the Conv's own output as fused away
    res = cli("compare", a, dump, "-o", tmp_path / "cmp")
    assert res.rc == 0, res.err
    with open(tmp_path / "cmp" / "compare.json") as f:
        report = {t["original"]: t for t in json.load(f)["tensors"]}
    assert report["c"]["status"] == "fused-away" and report["n"]["status"] == "paired"
    assert report["n"]["max_rel"] < 1e-5


def test_compare_pairs_a_graph_output_whose_identity_was_eliminated(cli, tmp_path):
    """x -> Relu (r) -> Identity -> y: cleanup removes the Identity and Relu now writes y; the
    original's y (the Identity's output) pairs with the candidate's y, the interface."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["y"], name="id")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    res = cli("compare", path, "-p", "cleanup", "-o", tmp_path)
    assert res.rc == 0, res.err
    with open(tmp_path / "compare.json") as f:
        report = {t["original"]: t for t in json.load(f)["tensors"]}
    assert report["y"]["status"] == "paired" and report["y"]["candidate"] == "y"
    assert report["y"]["max_abs"] == 0.0
