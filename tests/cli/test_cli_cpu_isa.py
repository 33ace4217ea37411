"""The CPU instruction set in session.json / report.json, and `passctl run`'s warning when an int8
artifact runs on a CPU whose int8 kernels saturate where the one it was built for did not."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx

from passctl.support import cpu_isa
from passctl.targets import get_target


def _small_quantizable(path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (16, 8)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_isa_is_recorded_and_run_warns_on_a_cpu_that_lacks_it(cli, tmp_path, monkeypatch, caplog):
    src = tmp_path / "mm.onnx"
    _small_quantizable(src)
    out = tmp_path / "vnni"
    r = cli(src, "--pipeline", "quantize{budget=10}", "--target", "cpu-vnni", "-o", out)
    assert r.rc == 0, r.err
    session = json.loads((out / "session.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert session["target"]["isa"]["name"] == "vnni"
    assert report["target"]["isa"]["features"] == list(get_target("cpu-vnni").isa.features)
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "quantize-int8")
    assert stats["weight_bits"] == 8 and stats["target"]["isa"] == "vnni"
    # run on a CPU without VNNI (host_isa replaced): a warning naming what is missing
    monkeypatch.setattr(cpu_isa, "host_isa", lambda: get_target("cpu-avx2").isa)
    with caplog.at_level(logging.WARNING, logger="passctl.tools.run_artifact"):
        assert cli("run", out, "--runs", "1").rc == 0
    text = " ".join(rec.getMessage() for rec in caplog.records)
    assert "lacks avx512_vnni" in text and "saturating int16" in text
    # an artifact built for 7-bit weights runs as built anywhere on x86: no warning
    caplog.clear()
    safe = tmp_path / "avx2"
    assert cli(src, "--pipeline", "quantize{budget=10}", "--target", "cpu-avx2", "-o", safe).rc == 0
    with caplog.at_level(logging.WARNING, logger="passctl.tools.run_artifact"):
        assert cli("run", safe, "--runs", "1").rc == 0
    assert not [rec for rec in caplog.records if "saturating" in rec.getMessage()]
