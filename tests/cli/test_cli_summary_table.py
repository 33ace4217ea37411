"""The compile summary's pass table: scalar statistics only, at most 120 columns wide."""

from __future__ import annotations

import json
import re

from passctl.tools.report import TABLE_WIDTH, stats_text


def test_quantize_table_fits_120_columns_and_hides_nested_stats(cli, conv_bn_model, tmp_path):
    out = tmp_path / "out"
    result = cli(conv_bn_model, "--pipeline", "cleanup,quantize{budget=10}", "-o", out)
    assert result.rc == 0, result.err
    lines = result.out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pass "))
    end = next(i for i, line in enumerate(lines) if line.startswith("nodes: "))
    table = lines[start:end]
    assert max(len(line) for line in table) <= TABLE_WIDTH == 120
    text = " ".join(line.strip() for line in table)
    stats = next(p["stats"] for p in json.loads((out / "report.json").read_text())["passes"]
                 if p["name"] == "quantize-int8")
    # report.json keeps every statistic, nested ones included
    assert isinstance(stats["layers"], list) and isinstance(stats["search"], dict)
    assert isinstance(stats["target"], dict) and stats["quantized_layers"] == 1
    for key in ("layers", "search", "target"):
        assert not re.search(rf"(^|[ ,]){key}=", text), key
    assert "entries]" not in text and "keys}" not in text
    # the scalar ones are printed (wrapped over several lines, possibly split inside a word)
    shown = stats_text(stats)
    assert len(shown) > TABLE_WIDTH  # so the cap (wrapping) is what keeps the table narrow
    assert "quantized_layers=1" in shown and "metric=mean-rel" in shown
    assert text.replace(" ", "").find(shown.replace(" ", "")) > 0


def test_stats_text_keeps_numbers_bools_and_short_strings():
    stats = {"n": 3, "zero": 0, "ok": True, "off": False, "rate": 0.5, "word": "minmax",
             "long": "x" * 41, "nested": {"a": 1}, "rows": [1, 2]}
    assert stats_text(stats) == "n=3, ok=True, rate=0.5, word=minmax"
    assert stats_text({"rows": [1]}) == "modified"
