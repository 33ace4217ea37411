"""amp through the passctl command line: the t4 bf16 refusal (exit 2) and a checked fp16 compile."""

from __future__ import annotations

import json

import onnx

from amp_graphs import layernorm_model
from passctl.tools.cli import main


def _run(capsys, *argv):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_bf16_for_t4_exits_2_with_one_line(tmp_path, capsys):
    model = tmp_path / "ln.onnx"
    onnx.save(layernorm_model(), str(model))
    rc, text = _run(capsys, model, "--pipeline", "amp{dtype=bf16}", "--target", "t4",
                    "-o", tmp_path / "out")
    assert rc == 2 and "bf16 is not supported on target t4" in text and "sm_80" in text
    assert not (tmp_path / "out").exists()


def test_fp16_compile_checks_and_reports_each_node(tmp_path, capsys):
    model = tmp_path / "ln.onnx"
    onnx.save(layernorm_model(), str(model))
    out = tmp_path / "out"
    rc, text = _run(capsys, model, "--pipeline", "amp{dtype=fp16,samples=1}", "--target", "a10",
                    "-o", out, "--check", "--rtol", "1e-2")
    assert rc == 0, text
    # the terminal summary shows scalar statistics only; the per-node list is in report.json
    # (the row may wrap onto continuation lines that start with blanks, up to the next pass row)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("mixed-precision"))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    row = " ".join(line.strip() for line in lines[start:end])
    assert "low_nodes=1" in row and "nodes=[" not in text and "target={" not in text
    report = json.loads((out / "report.json").read_text())
    assert report["check"]["ok"] and report["check"]["max_rel"] < 1e-2
    stats = next(p["stats"] for p in report["passes"] if p["name"] == "mixed-precision")
    assert stats["target"] == {"target": "a10", "compute_capability": "sm_86",
                               "dtypes": ["fp16", "bf16"], "emulated": False}
    assert len(stats["nodes"]) == 10 and stats["low_nodes"] == 1 and stats["fp32_nodes"] == 9
    assert "search" in stats and stats["search"]["seconds"] >= 0
    # the emitter loaded it with ORT's full optimizations (LayerNormFusion): no Cast inside the norm
    emitted = onnx.load(str(out / "model.onnx"))
    assert onnx.TensorProto.FLOAT16 in {i.data_type for i in emitted.graph.initializer}
