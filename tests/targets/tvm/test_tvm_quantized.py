"""A quantize-int8 (QDQ) graph through the TVM llvm emitter: its self-check and the artifact's
numerics against ONNX Runtime (optimizations off: the graph as written) and the fp32 original."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from passctl.ir import load, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.targets import get_target
from passctl.support.check import run_onnxruntime

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from corpus import package_file  # noqa: E402

pytest.importorskip("tvm")


@pytest.mark.slow
def test_quantized_ppocr_cls_runs_in_tvm(tmp_path):
    from passctl.targets.tvm import TvmEmitter, load_artifact

    source = package_file("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    model = load(source)
    result = PassManager(build_pipeline(
        'cleanup,fuse,quantize,lower-tvm{dims="x[0]=1,x[2]=48,x[3]=192"}', "cpu", "tvm")).run(model)
    stats = next(r.stats for r in result.records if r.name == "quantize-int8")
    assert stats["quantized_layers"] >= 1
    out = tmp_path / "cls"
    info = TvmEmitter().emit(model, get_target("cpu"), str(out))  # its self-check must pass
    assert info["self_check"]["ok"] is True
    # An int8 QDQ graph is not bit-stable across implementations (a one-ulp float difference before
    # a QuantizeLinear moves a value one level, and flips compound): TVM's int8 result must be as
    # close to the fp32 original as ONNX Runtime's run of the same QDQ graph is, over 5 inputs.
    art, proto, name = load_artifact(str(out)), to_onnx(model), "save_infer_model/scale_0.tmp_1"

    def mean_rel(a, b):
        return float(np.abs(np.asarray(a, np.float64) - b).sum() / np.abs(b).sum())

    tvm_err, ort_err = [], []
    for seed in range(5):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)}
        fp32 = run_onnxruntime(source, feeds)[name].astype(np.float64)
        tvm_err.append(mean_rel(art.run(feeds)[name], fp32))
        ort_err.append(mean_rel(run_onnxruntime(proto, feeds)[name], fp32))
    assert np.mean(tvm_err) <= 1.25 * np.mean(ort_err) + 1e-3, (tvm_err, ort_err)
