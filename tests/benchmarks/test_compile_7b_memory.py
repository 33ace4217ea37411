"""benchmarks/compile_7b_memory.py's Llama writer, compiled with the int4 pipeline: the artifact
against ONNX Runtime on the original, within what round-to-nearest int4 gives (numpy qdq)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from compile_7b_memory import PIPELINE, LlamaShape, write_model  # noqa: E402


def _run(model, ids):
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input_ids": ids})[0].astype(np.float32)


def _rtn_int4(w: np.ndarray, block: int = 128) -> np.ndarray:
    """Symmetric blockwise int4 quantize-dequantize along K (scale = signed max / -8, fp16)."""
    k, n = w.shape
    b = w.astype(np.float32).reshape(k // block, block, n)
    ext = np.take_along_axis(b, np.abs(b).argmax(1)[:, None, :], 1)
    s = (ext / -8).astype(np.float16).astype(np.float32)
    s[s == 0] = 1
    return (np.clip(np.rint(b / s), -8, 7) * s).reshape(k, n).astype(np.float16)


def test_two_layer_int4_artifact_matches_rtn_error(tmp_path):
    src = str(tmp_path / "model.onnx")
    write_model(src, LlamaShape(layers=2, hidden=256, heads=4, ffn=512, vocab=1024))
    out = tmp_path / "out"
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "passctl.tools.cli", "compile", src, "--pipeline",
                           PIPELINE, "--target", "cpu", "-o", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    art = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert sum(n.op_type == "MatMulNBits" for n in art.graph.node) == 15
    ids = np.random.default_rng(1).integers(0, 1024, (1, 16)).astype(np.int64)
    ref = _run(src, ids)
    got = _run(str(out / "model.onnx"), ids)
    m = onnx.load(src)
    weights = {n.input[1] for n in m.graph.node if n.op_type == "MatMul"}
    for t in m.graph.initializer:
        if t.name in weights:
            t.CopyFrom(onnx.numpy_helper.from_array(_rtn_int4(onnx.numpy_helper.to_array(t)), t.name))
    qdq = _run(m.SerializeToString(), ids)
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
    assert 0.05 < rel(qdq, ref) < 0.5  # int4 RTN changes the logits by this much
    assert rel(got, ref) < 1.1 * rel(qdq, ref)
    assert rel(got, qdq) < 0.05  # the rest: int8 activations of accuracy_level 4



def _quantize_peak(folder, layers: int):
    """(peak, held) Python memory in bytes (tracemalloc, which numpy reports its arrays to; the
    memory-mapped weights are not counted) of quantize-weights bits=4 on the writer's decoder."""
    import tracemalloc

    from passctl.ir import load
    from passctl.passes.common.infer_shapes import InferShapes
    from passctl.passes.quantize.weights import QuantizeWeights

    src = str(folder / f"model{layers}.onnx")
    write_model(src, LlamaShape(layers=layers, hidden=512, heads=8, ffn=1408, vocab=4096))
    model = load(src)
    InferShapes().run(model)  # MatMuls of an untyped fp16 data input are not layers
    tracemalloc.start()
    try:
        result = QuantizeWeights(bits=4).run(model)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.stats["quantized_layers"] == 7 * layers + 1
    return peak, held


def test_streaming_quantize_weights_peak_does_not_grow_with_layers(tmp_path):
    """quantize-weights on external fp16 weights quantizes, spills and drops one layer at a time,
    so its peak Python memory is one layer's working set whatever the depth: 8 layers may peak
    above 2 layers by at most a quarter of the 6 extra layers' unpacked codes (one byte per
    weight, 3.2 MB a layer here). Before the fix the pass kept a ``codes[:0]`` view per layer
    until it returned; a view keeps its base, the whole uint8 codes array (at 7B: 6.7 GB)."""
    per_layer = 4 * 512 * 512 + 3 * 512 * 1408
    peak2, _ = _quantize_peak(tmp_path, 2)
    peak8, held8 = _quantize_peak(tmp_path, 8)
    print(f"peak 2 layers {peak2 / 1e6:.1f} MB, 8 layers {peak8 / 1e6:.1f} MB, held after "
          f"{held8 / 1e6:.2f} MB; 6 layers' codes {6 * per_layer / 1e6:.1f} MB")
    assert peak8 - peak2 < 0.25 * 6 * per_layer
    assert held8 < 0.05 * 8 * per_layer
