"""``passctl bisect`` on a quantize run whose budget is exceeded: it names the layer whose int8
change crosses the bound (the stepping hook ``QuantizeInt8.max_layers``)."""

from __future__ import annotations

import numpy as np
import onnx
from compare_helpers import run_all_tensors
from onnx import TensorProto, helper, numpy_helper

from passctl.ir.onnx_export import to_onnx
from passctl.ir.parser import parse_model
from passctl.support.inputs import make_inputs


def _outlier_convnet(path) -> None:
    """x[1,3,16,16] -> conv1 -> Relu -> conv2 -> Relu -> conv3 -> y. conv2's output channel 0 sits
    near 500 (bias) and conv3 ignores that channel: int8 with one scale per tensor on conv2's
    output rounds the channels conv3 reads to a step of about 4."""
    rng = np.random.default_rng(0)
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.3
    b2 = np.zeros(8, np.float32)
    b2[0] = 500.0
    w3 = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3
    w3[:, 0] = 0.0
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
        (np.zeros(8, np.float32), "b1"), (w2, "w2"), (b2, "b2"), (w3, "w3")]]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3", pads=[1] * 4)]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 16, 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _mean_rel(ref, got) -> float:
    a, b = ref.astype(np.float64), got.astype(np.float64)
    return float(np.sum(np.abs(a - b)) / np.sum(np.abs(a)))


def _with_int8_roundtrip(path, value: str, feeds) -> float:
    """mean-rel of y when ``value`` goes through a per-tensor int8 Quantize/Dequantize by hand
    (scale max|value| / 127)."""
    proto = onnx.load(str(path))
    ref = run_all_tensors(proto, feeds)
    scale = float(np.max(np.abs(ref[value]))) / 127.0
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), "s"),
                                    numpy_helper.from_array(np.array(0, np.int8), "z")])
    for n in proto.graph.node:
        n.input[:] = [f"{value}_dq" if i == value else i for i in n.input]
    proto.graph.node.extend([
        helper.make_node("QuantizeLinear", [value, "s", "z"], [f"{value}_q"]),
        helper.make_node("DequantizeLinear", [f"{value}_q", "s", "z"], [f"{value}_dq"])])
    order = _toposort(list(proto.graph.node))
    del proto.graph.node[:]
    proto.graph.node.extend(order)
    return _mean_rel(ref["y"], run_all_tensors(proto, feeds)["y"])


def _toposort(nodes):
    done, out, pending = {"x", "w1", "b1", "w2", "b2", "w3", "s", "z"}, [], list(nodes)
    while pending:
        for n in pending:
            if all(i in done for i in n.input):
                out.append(n)
                done.update(n.output)
                pending.remove(n)
                break
    return out


def _run_pir(path, feeds):
    with open(path, encoding="utf-8") as f:
        model = parse_model(f.read(), str(path))
    return run_all_tensors(to_onnx(model), feeds)["y"]


def test_bisect_quantize_names_the_layer_crossing_the_bound(cli, tmp_path):
    model = tmp_path / "outlier.onnx"
    _outlier_convnet(model)
    feeds = make_inputs(str(model), seed=0)
    # independently: int8 on conv1's output keeps mean-rel 0.05, on conv2's output it does not
    assert _with_int8_roundtrip(model, "r1", feeds) < 0.05 < _with_int8_roundtrip(model, "r2",
                                                                                   feeds)
    res = cli("bisect", model, "-p", "quantize{budget=10}", "--bound", "mean-rel=0.05",
              "-o", tmp_path / "repro")
    assert res.rc == 0, res.err
    assert "quantize-int8" in res.out
    line = next(l for l in res.out.splitlines() if l.startswith("first rewrite breaking it"))
    assert "rule 'int8' at node 'conv2' (Conv), provenance conv2" in line, res.out
    # the reproducer's IR before and after that one layer, run in ONNX Runtime
    ref = run_all_tensors(onnx.load(str(model)), feeds)["y"]
    before = _mean_rel(ref, _run_pir(tmp_path / "repro" / "before.pir", feeds))
    after = _mean_rel(ref, _run_pir(tmp_path / "repro" / "after.pir", feeds))
    assert before <= 0.05 < after
    res = cli("diff", tmp_path / "repro" / "before.pir", tmp_path / "repro" / "after.pir")
    changed = [l for l in res.out.splitlines() if l[:1] in "~*+-"]
    assert len(changed) == 1 and "Conv 'conv2'" in changed[0], res.out
