"""passctl show / verify / list-passes / list-targets / --help; compiling IR text (.pir)."""

import dataclasses
import json
import re

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from passctl.ir.onnx_export import to_onnx
from passctl.ir.parser import parse_model
from passctl.tools.model_source import resolve_model_path

CLS_SPEC = "rapidocr_onnxruntime:models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
X = np.random.default_rng(2).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)


def _ort(model, feeds):
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_show_prints_text_that_parses_back(cli, tmp_path):
    r = cli("show", CLS_SPEC)
    assert r.rc == 0, r.err
    pir = tmp_path / "cls.pir"
    pir.write_text(r.out)
    # Large weights are referenced to the source model, not inlined: the text stays small.
    src = resolve_model_path(CLS_SPEC)
    assert "@onnx(" in r.out
    assert len(r.out.encode()) < 0.5 * len(open(src, "rb").read())
    model = parse_model(pir.read_text(), str(pir))
    for a, b in zip(_ort(src, {"x": X}), _ort(to_onnx(model), {"x": X})):
        np.testing.assert_array_equal(a, b)


def test_compile_from_ir_text(cli, tmp_path):
    pir = tmp_path / "cls.pir"
    pir.write_text(cli("show", CLS_SPEC).out)
    out = tmp_path / "out"
    r = cli(pir, "--pipeline", "cleanup,fuse-conv-bn", "--check", "-o", out, "-q",
            "--dim", "x[2]=48", "--dim", "x[3]=192")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["path"] == str(pir) and report["check"]["ok"]
    src = resolve_model_path(CLS_SPEC)
    (ref,), (got,) = _ort(src, {"x": X}), _ort(out / "model.onnx", {"x": X})
    assert np.max(np.abs(ref - got)) <= 1e-5 * np.max(np.abs(ref))


def test_default_output_folder_is_model_stem_in_cwd(cli, conv_bn_model, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = cli(conv_bn_model, "--pipeline", "cleanup", "-q")
    assert r.rc == 0, r.err
    assert sorted(p.name for p in (work / "conv_bn.passctl").iterdir()) == [
        "model.onnx", "report.json", "session.json"]


def test_list_targets_table(cli):
    from passctl.targets import list_targets

    r = cli("list-targets")
    assert r.rc == 0, r.err
    for t in list_targets():
        memory = f"{t.memory_bytes // 10**9} GB" if t.memory_bytes else "host"
        row = rf"^{re.escape(t.name)}\s+{re.escape(t.sm or '-')}\s+{memory}\s+" + re.escape(
            ", ".join(t.fast_dtypes) or "-")
        assert re.search(row, r.out, re.M), t.name


def test_list_passes_shows_names_summaries_and_options(cli):
    from passctl.passes.registry import list_passes

    r = cli("list-passes")
    assert r.rc == 0, r.err
    for cls in list_passes():
        assert re.search(rf"^{re.escape(cls.name)}\s+{re.escape(cls.summary)}", r.out, re.M)
        for f in cls.option_fields():
            assert f"{f.name}: " in r.out and (f.default is dataclasses.MISSING
                                               or repr(f.default) in r.out)
    from passctl.passes.registry import expand_alias

    cleanup = ", ".join(expand_alias("cleanup", "cpu"))
    assert re.search(rf"^cleanup\s+{re.escape(cleanup)}\s*$", r.out, re.M)


def test_verify_clean_warning_and_broken(cli, conv_bn_model, tmp_path):
    r = cli("verify", conv_bn_model)
    assert r.rc == 0 and r.out.strip().endswith("0 error(s), 0 warning(s)"), r.out
    r = cli("verify", "ddddocr:common.onnx")  # declared output shape differs from the computed one
    assert r.rc == 0 and "warning[output-type]" in r.out and "0 error(s), 1 warning(s)" in r.out
    graph = helper.make_graph([helper.make_node("Relu", ["x", "x"], ["y"], name="bad_relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    r = cli("verify", bad)
    assert r.rc == 2
    assert "bad_relu" in r.out and "error[" in r.out
    assert r.err.startswith("passctl: error: ") and "1 error(s)" in r.err


def test_help_and_version(cli):
    r = cli("--help")
    assert r.rc == 0
    for sub in ("compile", "show", "verify", "explain", "list-passes", "list-targets"):
        assert sub in r.out
    r = cli("compile", "--help")
    for opt in ("--pipeline", "--target", "--emit", "--check", "--dump-ir", "--timing",
                "--verify-each", "--load", "--print-ir-before", "--print-ir-after",
                "--print-ir-after-change", "--check-each"):
        assert opt in r.out
    r = cli("--version")
    assert r.rc == 0 and r.out.startswith("passctl ")


def test_explain_builtin_rule_and_unknown_rule(cli, conv_bn_model):
    r = cli("explain", "fold-conv-bias-bn", conv_bn_model)
    assert r.rc == 0, r.err
    assert "1 candidate BatchNormalization node(s); the rule would fire at 1" in r.out
    assert re.search(r"at BatchNormalization 'bn0': fires", r.out)
    r = cli("explain", "fold-conv-bm", conv_bn_model)
    assert r.rc == 2 and "unknown rewrite rule 'fold-conv-bm'; did you mean 'fold-conv-bn'" in r.err
