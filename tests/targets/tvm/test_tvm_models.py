"""Real models: the TVM llvm artifact matches the ONNX Runtime artifact of the same pipeline (1e-4 rel).

Build times on this 2-core machine (shared): MiniLM ~10 s, ResNet-50 ~10 s, PP-OCRv4 det ~15 s,
SmolLM2-135M at sequence 32 ~60 s (most of it writing and reading 540 MB of weights); all slow-marked.
"""

import numpy as np
import pytest
from tvm_helpers import rel_err

from passctl.ir import load, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.targets import get_emitter, get_target
from passctl.targets.onnxruntime import create_session
from passctl.targets.tvm import TvmEmitter, load_artifact
from passctl.support.inputs import make_inputs

# id -> (where it comes from, symbolic dims for lower-tvm and make_inputs)
MODELS = {
    "minilm_legacy": ("corpus", {"batch": 1, "sequence": 16}),
    "resnet50": ("zoo", {}),
    "ppocr_det": ("corpus", {"x[0]": 1, "x[2]": 64, "x[3]": 96}),
    "smollm2": ("zoo", {"batch": 1, "sequence": 32}),
}


def _path(model_id: str) -> str:
    kind, _ = MODELS[model_id]
    if kind == "zoo":
        from zoo import zoo_path

        return zoo_path(model_id)
    from corpus import CORPUS

    return CORPUS[model_id].path


def _dims_text(dims) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


@pytest.mark.slow
@pytest.mark.parametrize("model_id", list(MODELS))
def test_tvm_artifact_matches_onnxruntime_artifact(model_id, tmp_path):
    path = _path(model_id)
    _, dims = MODELS[model_id]
    ort_model = load(path)
    PassManager(build_pipeline("cleanup,fuse", "cpu")).run(ort_model)
    get_emitter("onnxruntime").emit(ort_model, get_target("cpu"), str(tmp_path / "ort"))

    tvm_model = load(path)
    text = "cleanup,fuse" + (f',lower-tvm{{dims="{_dims_text(dims)}"}}' if dims else ",lower-tvm")
    PassManager(build_pipeline(text, "cpu", "tvm")).run(tvm_model)
    info = TvmEmitter(self_check=False).emit(tvm_model, get_target("cpu"), str(tmp_path / "tvm"))
    assert info["files"] == ["ir.onnx", "manifest.json", "model.params", "model.so"]

    feeds = make_inputs(to_onnx(tvm_model), seed=1)  # static shapes: the dims are built in
    sess = create_session(str(tmp_path / "ort"))
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = load_artifact(str(tmp_path / "tvm")).run(feeds)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert np.isfinite(got[name]).all(), name
        # 1e-4 relative, plus an absolute 1e-6 for probability maps that are ~0 everywhere on
        # random inputs (PP-OCRv4 det's sigmoid output is ~1e-11, where ORT gives exact 0).
        diff = float(np.max(np.abs(got[name].astype(np.float64) - want[name])))
        assert diff <= 1e-4 * float(np.max(np.abs(want[name]))) + 1e-6, \
            (name, diff, rel_err(got[name], want[name]))
