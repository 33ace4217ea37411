"""``passctl compare`` pairing on PP-OCRv4 det after ``cleanup,fuse`` (a compiled ONNX Runtime
artifact), the HTML page in a headless browser, fp16 amp graphs, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import onnx
import pytest
from compare_helpers import max_rel, run_all_tensors
from onnx import TensorProto, helper, numpy_helper

from passctl.support.inputs import make_inputs
from corpus import package_file

DIMS = {"x[0]": 1, "x[2]": 64, "x[3]": 64}
DIM_ARGS = [a for k, v in DIMS.items() for a in ("--dim", f"{k}={v}")]


@pytest.fixture(scope="module")
def det():
    return package_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")


@pytest.fixture
def det_compared(det, cli, tmp_path):
    art = tmp_path / "art"
    res = cli(det, "-p", "cleanup,fuse", "-o", art, "-q")
    assert res.rc == 0, res.err
    res = cli("compare", det, art, *DIM_ARGS, "-o", tmp_path / "cmp")
    assert res.rc == 0, res.err
    with open(tmp_path / "cmp" / "compare.json") as f:
        return json.load(f), art / "model.onnx", tmp_path / "cmp", res.out


def test_ppocr_det_pairs_90_percent_of_the_tensors_that_still_exist(det, det_compared):
    report, artifact, _, _ = det_compared
    feeds = make_inputs(det, seed=0, dim_values=DIMS)
    ref = run_all_tensors(onnx.load(det), feeds)
    got = run_all_tensors(onnx.load(str(artifact)), feeds)
    paired = [t for t in report["tensors"] if t["status"] == "paired"]
    gone = [t for t in report["tensors"] if t["status"] != "paired"]
    for t in paired:  # never a stranger: same shape, and the same values (an fp32 pipeline)
        a, b = ref[t["original"]], got[t["candidate"]]
        assert a.shape == b.shape, t
        # (the head's Sigmoid output is about 1e-5 at most on random input: there 1e-6 absolute)
        assert max_rel(a, b) <= 1e-4 or np.max(np.abs(a.astype(np.float64) - b)) <= 1e-6, t
    # a tensor reported gone must not exist in the artifact: no artifact tensor of its shape
    # holds its values
    missed = [t for t in gone
              if any(v.shape == ref[t["original"]].shape and v.dtype.kind == "f"
                     and max_rel(ref[t["original"]], v) <= 1e-5 for v in got.values())]
    assert len(paired) / (len(paired) + len(missed)) >= 0.9
    assert report["counts"]["fused-away"] == sum(t["status"] == "fused-away" for t in gone) > 0
    fused_ops = {t["op_type"] for t in gone}
    assert "Clip" in fused_ops  # HardSwish's inner Clip no longer exists after fusion


def _page_checks_js() -> str:
    return """<script>
const box = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return {w: r.width, h: r.height, visible: s.visibility !== 'hidden' && s.display !== 'none'}; };
const links = [...document.querySelectorAll('a[href^="#"]')];
document.body.setAttribute('data-rendered', JSON.stringify({
  plot: box(document.getElementById('plot')), table: box(document.getElementById('worst')),
  points: [...document.querySelectorAll('#plot circle')].filter(c => box(c).w > 0).length,
  rows: [...document.querySelectorAll('#worst tbody tr')].filter(r => box(r).h > 0).length,
  links: links.length,
  dangling: links.filter(a => !document.getElementById(a.getAttribute('href').slice(1))).length,
  target_lines: links.filter(a => { const t = document.getElementById(a.getAttribute('href').slice(1));
    return t && t.closest('#ir') && t.textContent.includes('='); }).length}));
</script>"""


class _Dom(HTMLParser):
    """The fallback when no browser is installed: element ids, links, circles, table rows."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.circles, self.rows, self.stack = set(), [], 0, 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href", "").startswith("#"):
            self.links.append(a["href"][1:])
        self.circles += tag == "circle"
        self.rows += tag == "tr"


def test_compare_html_renders_plot_and_table_with_working_links(det_compared, tmp_path):
    report, _, folder, _ = det_compared
    page = (folder / "compare.html").read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<link" not in page and "src=" not in page  # self-contained
    paired = report["counts"]["paired"]
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(b)), None)
    if browser is None and os.environ.get("PASSCTL_REQUIRE_BROWSER"):  # .ci/run installs one
        pytest.fail("no chromium on PATH: apt-get install chromium (PASSCTL_REQUIRE_BROWSER is set)")
    if browser is not None:  # Debian's chromium (apt-get install chromium) renders the page
        probe = tmp_path / "probe.html"
        probe.write_text(page.replace("</body>", _page_checks_js() + "</body>"))
        run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                              "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                             timeout=120)
        m = re.search(r'data-rendered="([^"]*)"', run.stdout)
        assert m, run.stderr[-2000:]
        got = json.loads(m.group(1).replace("&quot;", '"'))
        assert got["plot"]["w"] > 300 and got["plot"]["h"] > 100 and got["plot"]["visible"]
        assert got["table"]["w"] > 300 and got["table"]["h"] > 100 and got["table"]["visible"]
        assert got["points"] == paired
        assert got["rows"] == min(30, paired)
        assert got["links"] == paired + min(30, paired)  # a link per plot point and table row
        assert got["dangling"] == 0
        assert got["target_lines"] == got["links"]  # each lands on a defining line of the IR
    else:  # no browser on this machine: the parsed DOM only
        dom = _Dom()
        dom.feed(page)
        assert dom.circles == paired and dom.rows == min(30, paired) + 1
        assert dom.links and all(link in dom.ids for link in dom.links)


def _fp16_sensitive_model(path) -> None:
    """x[2,8] -> MatMul(W) -> Add(1000) -> Sub(1000) -> Mul(2) -> y: the Add's output is near 1000,
    where fp16's spacing is 0.5, so computing it in fp16 loses the MatMul's result."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array(1000.0, np.float32), "big"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "big"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["shifted", "big"], ["back"], name="unshift"),
             helper.make_node("Mul", ["back", "two"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "sensitive", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _error_with_fp16(path, fp16_nodes, feeds) -> float:
    """max-rel of output y when the named nodes compute in fp16 (Casts around them, by hand)."""
    proto = onnx.load(str(path))
    out = []
    for n in proto.graph.node:
        if n.name in fp16_nodes:
            ins = []
            for i, name in enumerate(n.input):
                out.append(helper.make_node("Cast", [name], [f"{n.name}_in{i}"], to=TensorProto.FLOAT16))
                ins.append(f"{n.name}_in{i}")
            res = n.output[0]
            out.append(helper.make_node(n.op_type, ins, [res + "_h"]))
            out.append(helper.make_node("Cast", [res + "_h"], [res], to=TensorProto.FLOAT))
        else:
            out.append(n)
    del proto.graph.node[:]
    proto.graph.node.extend(out)
    ref = run_all_tensors(onnx.load(str(path)), feeds)["y"]
    return max_rel(ref, run_all_tensors(proto, feeds)["y"])


def test_bisect_amp_names_the_node_whose_fp16_crosses_the_bound(cli, tmp_path):
    model = tmp_path / "sensitive.onnx"
    _fp16_sensitive_model(model)
    feeds = make_inputs(str(model), seed=0)
    # independently: the MatMul alone in fp16 keeps 1e-2, the MatMul and the Add do not
    assert _error_with_fp16(model, {"mm"}, feeds) < 1e-2 < _error_with_fp16(model, {"mm", "shift"},
                                                                             feeds)
    res = cli("bisect", model, "-p", "amp{dtype=fp16,measure=false}", "--bound", "max-rel=1e-2",
              "-o", tmp_path / "repro")
    assert res.rc == 0, res.err
    assert "mixed-precision" in res.out
    line = next(l for l in res.out.splitlines() if l.startswith("first rewrite breaking it"))
    assert "rule 'precision fp16' at node 'shift' (Add)" in line, res.out


def test_compare_amp_fp16_pairs_across_precisions(cli, tmp_path):
    model = tmp_path / "sensitive.onnx"
    _fp16_sensitive_model(model)
    res = cli("compare", model, "-p", "amp{dtype=fp16,measure=false}",
              "--bound", "max-rel=1e-2", "-o", tmp_path)
    assert res.rc == 0, res.err
    with open(tmp_path / "compare.json") as f:
        report = json.load(f)
    by_name = {t["original"]: t for t in report["tensors"]}
    assert all(by_name[n]["status"] == "paired" for n in ("mm", "shifted", "back", "y"))
    assert by_name["mm"]["candidate_dtype"] == "float16"
    feeds = make_inputs(str(model), seed=0)
    ref = run_all_tensors(onnx.load(str(model)), feeds)
    # the MatMul in fp16: its error is fp16 rounding of the float32 product, about 2^-11
    assert max_rel(ref["mm"], ref["mm"].astype(np.float16)) == pytest.approx(
        by_name["mm"]["max_rel"], abs=2e-3)
    assert report["first_jump"] == "back"  # 1000 + x rounded to 0.5, then 1000 subtracted


def test_compare_bad_bound_is_one_line_user_error(cli, tmp_path):
    model = tmp_path / "sensitive.onnx"
    _fp16_sensitive_model(model)
    res = cli("compare", model, "-p", "cleanup", "--bound", "max-abs=1", "-o", tmp_path / "o")
    assert res.rc == 2 and "--bound 'max-abs=1'" in res.err and len(res.err.splitlines()) == 1
    assert not os.path.exists(tmp_path / "o")
    res = cli("compare", model, "-o", tmp_path / "o")
    assert res.rc == 2 and "give the candidate" in res.err
    res = cli("bisect", model, "-p", "cleanup", "--bound", "max-rel=1e-4", "-o", model)
    assert res.rc == 2 and "is a file" in res.err and len(res.err.splitlines()) == 1


def test_compare_int8_qdq_graph_pairs_dequantized_tensors(det, cli, tmp_path):
    """PP-OCRv4 det quantized to int8 QDQ (budget raised so layers go int8 on random feeds): the
    original's tensors pair with the candidate's float tensors after DequantizeLinear, same
    shapes, and no pair is a stranger (cosine > 0.9 on every pair: int8 keeps a tensor's direction,
    two different tensors of a CNN do not share it)."""
    dims = ";".join(f"{k}={v}" for k, v in DIMS.items())
    res = cli("compare", det, "-p", f"cleanup,fuse,quantize{{dims={dims},budget=1}}", *DIM_ARGS,
              "--bound", "mean-rel=0.05", "-o", tmp_path)
    assert res.rc == 0, res.err
    with open(tmp_path / "compare.json") as f:
        report = json.load(f)
    paired = [t for t in report["tensors"] if t["status"] == "paired"]
    assert any(t["candidate_op"] == "DequantizeLinear" for t in paired)
    ref = run_all_tensors(onnx.load(det), make_inputs(det, seed=0, dim_values=DIMS))
    for t in paired:
        assert t["shape"] == list(ref[t["original"]].shape)
        assert t["cosine"] > 0.9, t
