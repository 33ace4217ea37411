"""``export-decoder --weights int4|int8`` on tiny random transformers decoders: the artifact's
projections and LM head become MatMulNBits, it generates, and its logits stay near the float32
artifact's (transformers eager on the same weights is the reference of the float32 check)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "decoder"))
from decoder_helpers import tiny_model, word_tokenizer  # noqa: E402

from passctl.ir.errors import UserError  # noqa: E402
from passctl.targets.onnxruntime.generate import Generator  # noqa: E402
from passctl.tools.export_decoder import export_from_transformers  # noqa: E402


@pytest.mark.parametrize("family,fmt", [("llama", "int4"), ("qwen2", "int8")])
def test_quantized_decoder_artifact(tmp_path, family, fmt):
    import torch

    model = tiny_model(family, seed=1)
    out = tmp_path / fmt
    manifest = export_from_transformers(model, word_tokenizer(), str(out), max_length=32,
                                        weight_format=fmt, block=32)
    w = manifest["weights"]
    assert w["format"] == fmt and w["bits"] == (4 if fmt == "int4" else 8)
    proto = onnx.load(str(out / "model.onnx"))
    ops = [n.op_type for n in proto.graph.node]
    # 2 layers x (qkv, o, gate_up, down) + LM head (tied Gemm for llama, MatMul for qwen2)
    assert ops.count("MatMulNBits") == 9 and "MatMul" not in ops and "Gemm" not in ops
    assert json.loads((out / "decoder.json").read_text())["weights"]["quantized_layers"] == 9
    ids = np.array([[1, 42, 7, 100, 99, 3]], np.int64)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), use_cache=False).logits.float().numpy()[0, -1]
    gen = Generator(str(out))
    gen.reset(1)
    gen.step(ids[:, :5])
    got = gen.step(ids[:, 5:6])[0]
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    bound = 0.2 if fmt == "int4" else 0.03
    assert 0 < err < bound
    assert abs(w["logits_error"] - err) < 0.5 * bound  # the manifest's number is this error
    tokens = Generator(str(out)).generate(ids, max_new_tokens=4, stop_at_eos=False).tokens
    assert tokens.shape == (1, 4)


def test_onnx_source_with_weights_is_refused(tmp_path):
    import argparse

    from passctl.tools import export_decoder

    args = argparse.Namespace(model=str(tmp_path / "decoder.onnx"), out=str(tmp_path / "o"),
                              max_length=16, tokenizer=None, quiet=True, weights="int4",
                              block=None, asymmetric=False)
    (tmp_path / "decoder.onnx").write_bytes(b"")
    with pytest.raises(UserError, match="--weights int4 applies to GGUF / transformers"):
        export_decoder.main(args, None)
