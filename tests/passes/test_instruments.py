"""Instruments: each one's output is read back (files, printed text, reproducer command, checks)."""

from __future__ import annotations

import os
import shlex
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import parse

from passctl.ir import from_onnx, load
from passctl.passes.base import Pass, PassResult
from passctl.passes.instruments import CheckEach, CrashReproducer, DumpIR, PrintIR, Timing
from passctl.passes.manager import PassFailure, PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.passes.registry import load_plugin_file
from passctl.support.check import run_onnxruntime

MODEL = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x, float[2,3] z) => (float[2,3] y) {
        a = Identity (x)
        b = Add (a, z)
        y = Relu (b)
    }"""


class Noop(Pass):
    name = "noop"

    def run(self, model):
        return PassResult(False)


class AddToSub(Pass):
    """Deliberately wrong: turns every Add into Sub (so check-each must report an error)."""

    name = "add-to-sub"

    def run(self, model):
        changed = False
        for n in model.graph:
            if n.op_type == "Add":
                n.op_type, changed = "Sub", True
        return PassResult(changed)


def _inputs():
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((2, 3)).astype(np.float32),
            "z": rng.standard_normal((2, 3)).astype(np.float32)}


def test_dump_ir_writes_loadable_files_after_every_pass(tmp_path):
    proto = parse(MODEL)
    dump = DumpIR(tmp_path / "dump")
    PassManager(build_pipeline("eliminate-identity,dce") + [Noop()], instruments=[dump]).run(
        from_onnx(proto))
    names = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert names == ["000_input.onnx", "000_input.pir", "001_eliminate-identity.onnx",
                     "001_eliminate-identity.pir", "002_dce.onnx", "002_dce.pir", "003_noop.onnx",
                     "003_noop.pir"]
    feeds = _inputs()
    expected = np.maximum(feeds["x"] + feeds["z"], 0)
    for stem, ops in [("000_input", ["Identity", "Add", "Relu"]), ("001_eliminate-identity", ["Add", "Relu"]),
                      ("003_noop", ["Add", "Relu"])]:
        path = tmp_path / "dump" / f"{stem}.onnx"
        onnx.checker.check_model(onnx.load(str(path)))
        assert [n.op_type for n in onnx.load(str(path)).graph.node] == ops
        np.testing.assert_allclose(run_onnxruntime(str(path), feeds)["y"], expected, rtol=1e-6)
        text = (tmp_path / "dump" / f"{stem}.pir").read_text()
        assert ("Identity" in text) == ("Identity" in ops) and "Relu" in text


def test_print_ir_after_change_prints_only_after_changing_passes():
    out = []
    PassManager([Noop()] + build_pipeline("eliminate-identity") + [Noop()],
                instruments=[PrintIR(after_change=True, write=out.append)]).run(from_onnx(parse(MODEL)))
    assert len(out) == 1
    header, _, body = out[0].partition("\n")
    assert header == "// ----- IR after eliminate-identity (#2) ----- //"
    assert "Relu" in body and "Identity" not in body


def test_print_ir_before_and_after_named_passes():
    out = []
    PassManager([Noop()] + build_pipeline("eliminate-identity"),
                instruments=[PrintIR(before="eliminate-identity", after="all", write=out.append)]
                ).run(from_onnx(parse(MODEL)))
    headers = [t.split("\n", 1)[0] for t in out]
    assert headers == ["// ----- IR after noop (#1) ----- //",
                       "// ----- IR before eliminate-identity (#2) ----- //",
                       "// ----- IR after eliminate-identity (#2) ----- //"]
    assert "Identity" in out[1] and "Identity" not in out[2].split("\n", 1)[1]


def test_timing_table_lists_every_pass():
    out = []
    timing = Timing(write=out.append)
    PassManager(build_pipeline("eliminate-identity,dce,dce"), instruments=[timing]).run(
        from_onnx(parse(MODEL)))
    assert len(out) == 1 and len(timing.records) == 3
    rows = {}
    for line in out[0].splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] in ("eliminate-identity", "dce", "total"):
            rows[cells[0]] = cells
    assert rows["dce"][1] == "2" and rows["eliminate-identity"][1] == "1" and rows["total"][1] == "3"


def test_check_each_reports_an_error_per_pass():
    proto = parse(MODEL)
    feeds = _inputs()
    out = []
    check = CheckEach(proto, inputs=feeds, write=out.append)
    PassManager(build_pipeline("eliminate-identity") + [AddToSub(), Noop()], instruments=[check]).run(
        from_onnx(proto))
    assert len(out) == 3 and [name for _, name, _ in check.results] == ["eliminate-identity", "add-to-sub", "noop"]
    assert out[0].startswith("check after 001 eliminate-identity: max_abs 0, max_rel 0 (ok)")
    # Independently: relu(x+z) vs relu(x-z).
    want = np.abs(np.maximum(feeds["x"] + feeds["z"], 0) - np.maximum(feeds["x"] - feeds["z"], 0))
    want_abs = float(want.max())
    want_rel = want_abs / float(np.abs(np.maximum(feeds["x"] + feeds["z"], 0)).max())
    for line, (_, _, res) in zip(out[1:], check.results[1:]):
        assert "FAILED" in line
        assert res.outputs["y"].max_abs == pytest.approx(want_abs, rel=1e-6)
        assert res.max_rel == pytest.approx(want_rel, rel=1e-6)
        assert f"max_abs {want_abs:.3g}" in line


def test_check_each_makes_its_own_seeded_inputs():
    proto = parse(MODEL)
    check = CheckEach(proto, seed=3, write=lambda t: None)
    assert sorted(check.inputs) == ["x", "z"] and check.inputs["x"].shape == (2, 3)
    np.testing.assert_allclose(check.reference["y"],
                               np.maximum(check.inputs["x"] + check.inputs["z"], 0), rtol=1e-6)


PLUGIN = textwrap.dedent("""
    from passctl.passes.base import Pass, PassResult
    from passctl.passes.registry import register_pass

    @register_pass
    class RaiseOnRelu(Pass):
        name = "raise-on-relu"
        summary = "raises when it sees a Relu (a crash to reproduce)"

        def run(self, model):
            for node in model.graph:
                if node.op_type == "Relu":
                    raise RuntimeError(f"cannot handle {node.op_type} '{node.name}'")
            return PassResult(False)
""")


def test_crash_reproducer_folder_and_its_command(tmp_path):
    plugin = tmp_path / "crashy.py"
    plugin.write_text(PLUGIN)
    load_plugin_file(plugin)
    proto = parse(MODEL)
    repro = CrashReproducer(tmp_path / "crash", target="cpu", write=lambda t: None)
    passes = build_pipeline("eliminate-identity,raise-on-relu")
    with pytest.raises(PassFailure) as info:
        PassManager(passes, instruments=[repro]).run(from_onnx(proto))
    folder = Path(info.value.reproducer)
    assert folder == tmp_path / "crash" / "002_raise-on-relu"
    assert sorted(p.name for p in folder.iterdir()) == [
        "error.txt", "input.onnx", "input.pir", "pipeline.txt", "plugins", "reproduce.sh"]
    assert (folder / "plugins" / "crashy.py").read_text() == PLUGIN
    assert (folder / "pipeline.txt").read_text() == "raise-on-relu\n"
    assert "pass 'raise-on-relu' failed after passes [eliminate-identity]" in (folder / "error.txt").read_text()
    # The input is the IR the failing pass got: after eliminate-identity, same numerics as the original.
    got = onnx.load(str(folder / "input.onnx"))
    assert [n.op_type for n in got.graph.node] == ["Add", "Relu"]
    feeds = _inputs()
    np.testing.assert_allclose(run_onnxruntime(str(folder / "input.onnx"), feeds)["y"],
                               run_onnxruntime(proto, feeds)["y"], rtol=1e-6)
    assert "Relu" in (folder / "input.pir").read_text()
    script = (folder / "reproduce.sh").read_text()
    assert (f"{shlex.quote(sys.executable)} -m passctl.tools.cli input.onnx --pipeline raise-on-relu "
            "--target cpu --verify-each --load plugins/crashy.py") in script
    assert os.access(folder / "reproduce.sh", os.X_OK)
    # Running it reproduces the crash: the CLI exits 3 naming the same pass and error. It runs the
    # same interpreter (no passctl on PATH needed) and keeps its own reproducer next to $OUT.
    env = dict(os.environ, PATH="/usr/bin:/bin", OUT=str(tmp_path / "rerun" / "out"))
    run = subprocess.run(["sh", str(folder / "reproduce.sh")], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "pass 'raise-on-relu' failed" in run.stdout + run.stderr
    assert "cannot handle Relu" in run.stdout + run.stderr
    assert not (tmp_path / "rerun" / "out").exists()
    assert f"reproducer: {tmp_path / 'rerun' / 'reproducers'}" in run.stdout + run.stderr


def test_dump_ir_text_parses_back_with_its_weights_file(tmp_path):
    from passctl.ir import to_onnx
    from passctl.ir.parser import parse_file

    # fold-constants turns Mul(c, c) into a new 64-element constant the source file does not hold.
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[8,8] x) => (float[8,8] y) {
            c = Constant <value = float[8,8] {""" + ",".join(str(i / 7) for i in range(64)) + """}> ()
            s = Mul (c, c)
            y = Add (x, s)
        }""")
    dump = DumpIR(tmp_path)
    PassManager(build_pipeline("fold-constants"), instruments=[dump]).run(from_onnx(proto))
    assert (tmp_path / "001_fold-constants.weights").stat().st_size >= 64 * 4  # the folded constant
    reparsed = to_onnx(parse_file(str(tmp_path / "001_fold-constants.pir")))
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    c = (np.arange(64, dtype=np.float32) / 7).reshape(8, 8)
    np.testing.assert_allclose(run_onnxruntime(reparsed, {"x": x})["y"], x + c * c, rtol=1e-6)
