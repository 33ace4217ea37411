"""--dump-ir, --print-ir-after-change, --check-each and --timing, read back from their output."""

import json
import re

import numpy as np
import onnx
import onnxruntime as ort
from cli_helpers import conv_bn_proto  # tests/cli/cli_helpers.py

PIPELINE = "cleanup,fuse-conv-bn"
X = np.random.default_rng(5).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)

PERTURB_PLUGIN = '''
import numpy as np

from passctl.ir import Tensor
from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import register_pass


@register_pass(replace=True)
class PerturbPass(Pass):
    name = "perturb"
    summary = "scales the first Conv weight by 1.5 (a wrong rewrite, for --check-each tests)"

    def run(self, model):
        conv = next(n for n in model.graph if n.op_type == "Conv")
        w = conv.inputs[1]
        new = model.graph.add_constant(Tensor(w.const.numpy() * np.float32(1.5)), "w_perturbed")
        conv.set_input(1, new)
        return PassResult(True, {"perturbed": 1})
'''


def _run(path_or_bytes):
    sess = ort.InferenceSession(path_or_bytes, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": X})[0]


def _report(out):
    return json.loads((out / "report.json").read_text())


def test_dump_ir_writes_every_stage(cli, conv_bn_model, tmp_path):
    from passctl.ir.parser import parse_model

    dump, out = tmp_path / "dump", tmp_path / "out"
    r = cli(conv_bn_model, "--pipeline", PIPELINE, "--dump-ir", dump, "-o", out, "-q")
    assert r.rc == 0, r.err
    records = _report(out)["passes"]
    stems = ["000_input"] + [f"{p['index']:03d}_{p['name']}" for p in records]
    # (.weights files hold the large constants of the .pir text next to them.)
    assert sorted(p.name for p in dump.iterdir() if p.suffix != ".weights") == sorted(
        f"{s}.{ext}" for s in stems for ext in ("onnx", "pir"))
    assert _report(out)["dump_ir"]["directory"] == str(dump)
    reference = _run(conv_bn_proto().SerializeToString())
    for stem in stems:
        # Every stage runs in ONNX Runtime with the original's results, and its text parses back.
        np.testing.assert_allclose(_run(str(dump / f"{stem}.onnx")), reference, rtol=1e-5,
                                   atol=1e-5)
        text = (dump / f"{stem}.pir").read_text()
        parsed = parse_model(text, str(dump / f"{stem}.pir"))
        ops = [n.op_type for n in onnx.load(str(dump / f"{stem}.onnx")).graph.node]
        assert [n.op_type for n in parsed.graph] == ops
    first, last = (dump / "000_input.pir").read_text(), (dump / f"{stems[-1]}.pir").read_text()
    assert "Identity" in first and "BatchNormalization" in first
    assert "Identity" not in last and "BatchNormalization" not in last
    np.testing.assert_array_equal(_run(str(dump / f"{stems[-1]}.onnx")),
                                  _run(str(out / "model.onnx")))


def test_print_ir_after_change_prints_only_changed_passes(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    r = cli(conv_bn_model, "--pipeline", PIPELINE, "--print-ir-after-change", "-o", out, "-q")
    assert r.rc == 0, r.err
    headers = re.findall(r"^// ----- IR after (\S+) \(#(\d+)\) ----- //$", r.out, re.M)
    changed = [(p["name"], str(p["index"])) for p in _report(out)["passes"] if p["modified"]]
    assert headers == changed
    names = [h[0] for h in headers]
    # compile's final dce runs after fuse-conv-bn (which leaves the folded weights unused)
    assert "eliminate-identity" in names and names[-2:] == ["fuse-conv-bn", "dce"]
    sections = re.split(r"^// ----- IR after .*$", r.out, flags=re.M)[1:]
    after_identity = sections[names.index("eliminate-identity")]
    after_fold = sections[names.index("fuse-conv-bn")]
    assert "Identity" not in after_identity and "BatchNormalization" in after_identity
    assert "BatchNormalization" not in after_fold and "Conv" in after_fold


def test_print_ir_before_and_after_named_pass(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", PIPELINE, "--print-ir-before", "fuse-conv-bn",
            "--print-ir-after", "fuse-conv-bn", "-o", tmp_path / "out", "-q")
    assert r.rc == 0, r.err
    assert len(re.findall(r"^// ----- IR before fuse-conv-bn", r.out, re.M)) == 1
    assert len(re.findall(r"^// ----- IR after fuse-conv-bn", r.out, re.M)) == 1
    assert len(re.findall(r"^// ----- IR (before|after) ", r.out, re.M)) == 2


def test_check_each_reports_every_pass(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    r = cli(conv_bn_model, "--pipeline", PIPELINE, "--check-each", "--check", "-o", out, "-q")
    assert r.rc == 0, r.err
    lines = re.findall(r"^check after (\d{3}) (\S+): max_abs (\S+), max_rel (\S+) \((.*)\)$",
                       r.out, re.M)
    report = _report(out)
    assert [(int(i), n) for i, n, *_ in lines] == [(p["index"], p["name"])
                                                   for p in report["passes"]]
    assert all(mark == "ok" for *_, mark in lines)
    assert [e["pass"] for e in report["check_each"]] == [p["name"] for p in report["passes"]]
    assert all(e["ok"] for e in report["check_each"])
    # The last stage is the artifact: its error equals --check's on the same seeded inputs.
    assert report["check_each"][-1]["max_rel"] == report["check"]["max_rel"]


def test_check_each_finds_the_wrong_pass(cli, conv_bn_model, tmp_path):
    plugin = tmp_path / "perturb.py"
    plugin.write_text(PERTURB_PLUGIN)
    out = tmp_path / "out"
    r = cli(conv_bn_model, "--load", plugin, "--pipeline", "eliminate-identity,perturb,dce",
            "--check-each", "-o", out, "-q")
    assert r.rc == 0, r.err
    lines = dict(re.findall(r"^check after \d{3} (\S+): max_abs \S+, max_rel \S+ \((.*)\)$",
                            r.out, re.M))
    assert lines["eliminate-identity"] == "ok"
    assert lines["perturb"].startswith("FAILED") and lines["dce"].startswith("FAILED")
    # Independently: the artifact differs from the original by far more than rounding.
    diff = np.max(np.abs(_run(str(out / "model.onnx")) - _run(conv_bn_proto().SerializeToString())))
    assert diff > 1e-2
    # With --check the same wrong rewrite is an internal error and no artifact is written.
    out2 = tmp_path / "out2"
    r = cli(conv_bn_model, "--load", plugin, "--pipeline", "perturb", "--check", "-o", out2,
            "--reproducer-dir", tmp_path / "crash", "-q")
    assert r.rc == 3 and "passctl: numeric check failed: output y: max_rel" in r.err
    assert "internal error" not in r.err and "loosen --rtol (now 0.0001)" in r.err
    assert not out2.exists()
    repro = r.err.split("passctl: reproducer: ")[1].strip()
    assert json.loads(open(f"{repro}/report.json").read())["check"]["ok"] is False


def test_timing_table(cli, conv_bn_model, tmp_path):
    r = cli(conv_bn_model, "--pipeline", PIPELINE, "--timing", "-o", tmp_path / "out", "-q")
    assert r.rc == 0, r.err
    assert "pass timing" in r.out
    for name in ("eliminate-identity", "fold-constants", "cse", "fuse-conv-bn"):
        assert re.search(rf"^\W*{name}\W+1\W", r.out, re.M), name
    assert re.search(r"^\W*dce\W+2\W", r.out, re.M)  # cleanup's and compile's final dce
