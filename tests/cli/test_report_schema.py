"""docs/report-schema.md documents every key of a full report.json; values are consistent."""

import json
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "report-schema.md"


def _documented(section_title=None):
    text = DOC.read_text()
    if section_title is not None:
        text = text.split(f"## {section_title}", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)? \|", text, re.M)
    return {key for pair in rows for key in pair if key}


def test_every_report_key_is_documented(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    r = cli(conv_bn_model, "--pipeline", "cleanup,fuse-conv-bn", "--check", "--check-each",
            "--dump-ir", tmp_path / "dump", "-o", out, "-q")
    assert r.rc == 0, r.err
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "passctl.report/1"
    assert set(report) <= _documented()
    assert set(report["artifact"]) <= _documented("`artifact` (ONNX Runtime emitter)")
    check_keys = _documented("`check`")
    assert set(report["check"]) <= check_keys
    doc = DOC.read_text()
    for key in report["check"]["outputs"][0]:
        assert f"`{key}`" in doc, key
    for entry in report["passes"]:
        assert set(entry) == {"index", "name", "time_ms", "modified", "stats", "round"}
    # Consistency between sections of one report.
    assert report["pipeline"]["passes"] == [p["name"] for p in report["passes"]]
    assert sum(report["op_histogram"]["before"].values()) == report["nodes"]["before"] == 4
    assert report["op_histogram"]["after"] == {"Conv": 1, "Relu": 1}
    assert report["artifact"]["files"] == ["model.onnx", "session.json"]
    assert report["timing"]["total_s"] >= report["timing"]["passes_s"] >= 0
    assert [e["index"] for e in report["check_each"]] == [p["index"] for p in report["passes"]]
    assert [(i["name"], i["shape"], i["dtype"]) for i in report["check"]["inputs"]] == [
        ("x", [1, 3, 8, 8], "float32")]
