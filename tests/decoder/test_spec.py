"""DecoderSpec from transformers configs: what is read, what is refused (one line each)."""

from __future__ import annotations

import pytest
import transformers

from passctl.ir.errors import UserError
from passctl.passes.decoder.spec import check_max_length, spec_from_config
from passctl.tools.export_decoder import export_from_transformers
from decoder_helpers import tiny_model


def _llama(**kw):
    base = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaConfig(**{**base, **kw})


def test_spec_reads_sizes_and_end_tokens():
    spec = spec_from_config(_llama(eos_token_id=[7, 9], head_dim=32))
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.eos_token_ids) == (4, 2, 32, (7, 9))


@pytest.mark.parametrize("config,message", [
    (transformers.GPT2Config(), "model type 'gpt2' has no decoder layout"),
    (_llama(hidden_act="gelu"), "activation 'gelu'"),
    (_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "rope type 'dynamic' changes with the sequence length"),
    (_llama(num_key_value_heads=3), "not a multiple"),
])
def test_unsupported_configs_are_refused(config, message):
    with pytest.raises(UserError, match=message) as info:
        spec_from_config(config, name="cfg")
    assert "\n" not in str(info.value)


def test_cache_length_limits():
    spec = spec_from_config(transformers.MistralConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        sliding_window=64))
    check_max_length(spec, 64)
    with pytest.raises(UserError, match="beyond the model's sliding window 64"):
        check_max_length(spec, 65)
    with pytest.raises(UserError, match="max_position_embeddings 256"):
        check_max_length(spec, 300)
    with pytest.raises(UserError, match="at least 2"):
        check_max_length(spec, 1)


def test_export_replaces_an_artifact_but_refuses_a_foreign_folder(tmp_path):
    model = tiny_model("llama")
    out = tmp_path / "out"
    export_from_transformers(model, None, str(out), max_length=16, check=False)
    export_from_transformers(model, None, str(out), max_length=20, check=False)
    assert '"max_length": 20' in (out / "decoder.json").read_text()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="not empty and holds no decoder artifact"):
        export_from_transformers(model, None, str(tmp_path / "mine"), max_length=16)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".passctl")] == []
