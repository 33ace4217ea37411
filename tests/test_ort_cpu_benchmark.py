"""benchmarks/ort_cpu.py: profiler parsing, headroom share and the summary table on a tiny model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "ort_cpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ort_cpu", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_headroom_counts_every_matmul_gemm_conv_variant_as_matrix_work(bench):
    by_op = {"MatMul": 40.0, "FusedMatMul": 10.0, "Gemm": 5.0, "FusedConv": 20.0, "QLinearConv": 5.0,
             "MatMulNBits": 5.0, "Add": 10.0, "SkipLayerNormalization": 5.0}
    assert bench.headroom(by_op) == pytest.approx(15.0 / 100.0)
    assert np.isnan(bench.headroom({}))


def test_op_time_shares_reads_ort_profiler_node_events(bench, tmp_path):
    proto = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[64, 256] x) => (float[64, 256] y) <float[256, 256] w = {1.0}> {
            m = MatMul(x, w)
            r = Relu(m)
            y = Add(r, x)
        }""")
    proto.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32), "w"))
    path = tmp_path / "tiny.onnx"
    onnx.save(proto, path)
    feeds = {"x": np.ones((64, 256), dtype=np.float32)}
    by_op = bench.op_time_shares(str(path), feeds, warmup=1, runs=3, folder=tmp_path)
    # ORT_ENABLE_ALL may fuse MatMul+Add or Relu into other kernels; whatever runs, MatMul work is
    # there and every time is positive.
    assert any(bench.GEMM_LIKE.search(op) for op in by_op), by_op
    assert all(t > 0 for t in by_op.values()), by_op
    assert 0.0 <= bench.headroom(by_op) < 1.0
    assert not list(tmp_path.glob("profile*.json")), "the profiler trace is removed"


def test_summary_ratios_and_headroom_taken(bench):
    row = {"label": "toy", "ms": {"disabled": 12.0, "ort-all": 10.0, "onnxslim": 9.0, "passctl": 8.0},
           "p20_ms": {"disabled": 11.0, "ort-all": 9.0, "onnxslim": 8.5, "passctl": 8.5},
           "errors": {}, "max_rel": {"passctl": 1e-6}, "info": {}, "headroom": 0.25,
           "headroom_passctl": 0.1, "ops_all": {"MatMul": 3.0, "Add": 1.0}}
    table = bench.summarize([row])
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    # best peer onnxslim 9.0 / passctl 8.0 = 1.125x; p20: 8.5 / 8.5 = 1.0x;
    # taken = (10 - 8) / (10 * 0.25) = 80%; ort-transformers was not run: n/a.
    assert cells == ["toy", "12.00", "10.00", "9.00", "n/a", "8.00", "onnxslim", "1.125x", "1.000x",
                     "25.0%", "10.0%", "80%"]


def test_fused_kernel_cases_compute_what_they_replace():
    """Each fused graph of benchmarks/ort_fused_kernels.py equals its unfused graph (no ORT rewrites)."""
    from passctl.support.check import compare, run_onnxruntime

    spec = importlib.util.spec_from_file_location("ort_fused_kernels", _PATH.parent / "ort_fused_kernels.py")
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    all_cases = kernels.cases()
    assert len(all_cases) == 5
    rng = np.random.default_rng(0)
    for name, (unfused, fused, inputs) in all_cases.items():
        feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in inputs}
        result = compare(run_onnxruntime(unfused, feeds), run_onnxruntime(fused, feeds))
        assert result.ok(1e-5), (name, result.failures(1e-5))
    rows = kernels.measure(runs=2)
    assert len(rows) == 2 + 2 * len(all_cases) and all(r.count("|") == 7 for r in rows)
