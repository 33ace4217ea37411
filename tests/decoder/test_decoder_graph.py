"""The decoder graph (passes/decoder) and its runtime (targets/onnxruntime/generate) against
transformers eager on tiny random Llama / Qwen2 / MQA models."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from decoder_helpers import VOCAB, tiny_model, word_tokenizer
from passctl.ir.errors import UserError
from passctl.targets.onnxruntime.generate import Generator
from passctl.tools.export_decoder import export_from_transformers

FAMILIES = ["llama", "qwen2", "mqa", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def artifact(request, tmp_path_factory):
    model = tiny_model(request.param)
    out = tmp_path_factory.mktemp(request.param) / "out"
    export_from_transformers(model, word_tokenizer(), str(out), max_length=40)
    return model, str(out)


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_prefill_and_decode_logits_match_transformers(artifact):
    model, out = artifact
    ids = np.random.default_rng(1).integers(2, VOCAB - 1, size=(1, 12))
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), use_cache=False).logits.numpy()[0]
    gen = Generator(out)
    gen.reset(1)
    got = [gen.step(ids[:, :7])[0]] + [gen.step(ids[:, t:t + 1])[0] for t in range(7, 12)]
    for k, row in enumerate(got):
        assert _rel(row, ref[6 + k]) < 1e-5, k


def test_greedy_tokens_equal_transformers_generate(artifact):
    model, out = artifact
    prompt = np.array([[5, 17, 42, 7, 99]], np.int64)
    with torch.no_grad():
        ref = model.generate(torch.from_numpy(prompt), max_new_tokens=30, do_sample=False,
                             eos_token_id=None, pad_token_id=0).numpy()[0, 5:]
    result = Generator(out).generate(prompt, max_new_tokens=30, stop_at_eos=False)
    assert result.tokens[0].tolist() == ref.tolist()
    assert result.time_to_first_token_s > 0 and result.tokens_per_s > 0


def test_batch_rows_are_independent(artifact):
    _, out = artifact
    gen = Generator(out)
    a = np.array([3, 9, 27, 81], np.int64)
    b = np.array([4, 8, 16, 32], np.int64)
    both = gen.generate(np.stack([a, b]), max_new_tokens=8, stop_at_eos=False).tokens
    assert both[0].tolist() == gen.generate(a, max_new_tokens=8, stop_at_eos=False).tokens[0].tolist()
    assert both[1].tolist() == gen.generate(b, max_new_tokens=8, stop_at_eos=False).tokens[0].tolist()


def test_sampling_is_seeded_and_top_p_tiny_is_greedy(artifact):
    _, out = artifact
    gen = Generator(out)
    prompt = [5, 6, 7]
    one = gen.generate(prompt, max_new_tokens=10, temperature=1.0, seed=3, stop_at_eos=False)
    two = gen.generate(prompt, max_new_tokens=10, temperature=1.0, seed=3, stop_at_eos=False)
    assert one.tokens.tolist() == two.tokens.tolist()
    greedy = gen.generate(prompt, max_new_tokens=10, stop_at_eos=False).tokens
    nucleus = gen.generate(prompt, max_new_tokens=10, temperature=1.0, top_p=1e-9, seed=5,
                           stop_at_eos=False).tokens
    assert nucleus.tolist() == greedy.tolist()


def test_prompt_longer_than_the_cache_is_one_line(artifact):
    _, out = artifact
    gen = Generator(out)
    with pytest.raises(UserError, match="needs a cache of 45, the artifact's holds 40"):
        gen.generate(list(range(2, 32)), max_new_tokens=16)
    assert gen.generate(list(range(2, 32)), max_new_tokens=11, stop_at_eos=False).tokens.shape == (1, 11)


def test_stops_at_eos(tmp_path):
    model = tiny_model("llama")
    prompt = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=0).numpy()[0, 3:]
    stop = int(ref[3])  # the 4th greedy token becomes the end token
    first = int(np.flatnonzero(ref == stop)[0])
    model.generation_config.eos_token_id = stop
    export_from_transformers(model, None, str(tmp_path / "out"), max_length=16, check=False)
    result = Generator(str(tmp_path / "out")).generate([5, 6, 7], max_new_tokens=8)
    assert result.tokens[0].tolist() == ref[:first + 1].tolist()


def test_huge_pages_leave_logits_bitwise_equal(artifact):
    """MADV_COLLAPSE moves the session's weights to 2 MB pages without changing a bit: the same
    prompt gives identical logits with and without it (and the plain session collapses nothing)."""
    _, out = artifact
    ids = np.array([[1, 5, 9, 3, 7]], np.int64)
    plain, huge = Generator(out, huge_pages=False), Generator(out)
    assert plain.huge_page_bytes == 0 and huge.huge_page_bytes >= 0
    for gen in (plain, huge):
        gen.reset(1)
    assert np.array_equal(plain.step(ids), huge.step(ids))
    assert np.array_equal(plain.step(ids[:, :1]), huge.step(ids[:, :1]))


def test_worker_spinning_follows_the_load_unless_given_and_logits_stay_bitwise_equal(
        artifact, monkeypatch):
    """The Generator's session lets ONNX Runtime's worker threads spin only when a core is free
    (spare_core: 1-minute load average below cores - 0.5), else they sleep; ``spinning=`` forces
    either. Only scheduling changes, not one bit of the logits."""
    from passctl.targets.onnxruntime import generate as gen_module

    _, out = artifact
    key = "session.intra_op.allow_spinning"
    cores = os.cpu_count() or 1
    monkeypatch.setattr(gen_module.os, "getloadavg", lambda: (cores + 3.0, 0.0, 0.0))
    loaded = Generator(out, threads=2)
    monkeypatch.setattr(gen_module.os, "getloadavg", lambda: (cores - 1.0, 0.0, 0.0))
    quiet = Generator(out, threads=2)
    forced = Generator(out, threads=2, spinning=False)
    assert (loaded.spinning, quiet.spinning, forced.spinning) == (False, True, False)
    for gen, entry in ((loaded, "0"), (quiet, "1"), (forced, "0")):
        assert gen.session.get_session_options().get_session_config_entry(key) == entry
    ids = np.array([[1, 5, 9, 3, 7]], np.int64)
    for gen in (loaded, quiet):
        gen.reset(1)
    assert np.array_equal(loaded.step(ids), quiet.step(ids))
    assert np.array_equal(loaded.step(ids[:, :1]), quiet.step(ids[:, :1]))


def test_subtract_keeps_only_new_memory():
    from passctl.targets.onnxruntime.generate import _subtract

    assert _subtract((0, 100), [(20, 30), (50, 60)]) == [(0, 20), (30, 50), (60, 100)]
    assert _subtract((0, 100), [(0, 100)]) == []
    assert _subtract((10, 20), [(0, 5), (30, 40)]) == [(10, 20)]
