"""``passctl export-decoder user.onnx``: a dynamo-exported Optimum-layout decoder rewritten into
the static-cache layout (canonical rotary + attention with past -> GroupQueryAttention on one
shared buffer), checked against transformers' own greedy tokens."""

from __future__ import annotations

import json

import numpy as np
import onnx
import torch

from passctl.passes.decoder.graph import LAYOUT
from passctl.passes.decoder.layout import DYNAMIC_LAYOUT
from passctl.targets.onnxruntime.generate import Generator


def _greedy(model, prompt, n):
    with torch.no_grad():
        return model.generate(torch.from_numpy(prompt), max_new_tokens=n, do_sample=False,
                              eos_token_id=None, pad_token_id=0).numpy()[0, prompt.shape[1]:]


def test_user_onnx_gets_the_static_cache_and_transformers_tokens(past_decoder, cli, tmp_path):
    """The artifact has passctl's layout (GroupQueryAttention with do_rotary per layer on [batch, kv, M, hd]
    caches, no attention_mask / position_ids inputs, logits of the last position), its check
    error is recorded, and 24 greedy tokens equal transformers' generate; the same tokens as the
    original run as it is (--keep-layout)."""
    model, path = past_decoder
    res = cli("export-decoder", path, "-o", tmp_path / "static", "--max-length", 40, "-q")
    assert res.rc == 0, res.err
    manifest = json.loads((tmp_path / "static" / "decoder.json").read_text())
    assert manifest["layout"] == LAYOUT and manifest["max_length"] == 40
    assert manifest["check_error"] < 1e-4
    graph = onnx.load(str(tmp_path / "static" / "model.onnx")).graph
    layers = model.config.num_hidden_layers
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == layers
    # the recognized rotary moved into the kernel (do_rotary with the folded caches of M rows)
    assert all(onnx.helper.get_attribute_value(a) == 1 for n in gqa for a in n.attribute
               if a.name == "do_rotary") and all(len(n.input) == 9 for n in gqa)
    # fuse-projections: packed Q/K/V straight from one MatMul (key and value omitted), gate/up one
    # MatMul: per layer qkv, o, gate_up, down, plus the LM head
    assert all(n.input[1] == "" and n.input[2] == "" for n in gqa)
    assert sum(n.op_type == "MatMul" for n in graph.node) == 4 * layers + 1
    assert not any(n.op_type == "RotaryEmbedding" for n in graph.node)
    assert {i.name for i in graph.input} >= {"seqlens_k", "total_sequence_length"}
    assert not {"attention_mask", "position_ids"} & {i.name for i in graph.input}
    cache = [d.dim_value or d.dim_param for d in graph.input[1].type.tensor_type.shape.dim]
    assert cache == ["batch", model.config.num_key_value_heads, 40, 16]
    prompt = np.array([[9, 8, 7, 6, 5]], np.int64)
    ref = _greedy(model, prompt, 24)
    got = Generator(str(tmp_path / "static")).generate(prompt, max_new_tokens=24, stop_at_eos=False)
    assert got.tokens[0].tolist() == ref.tolist()
    res = cli("export-decoder", path, "-o", tmp_path / "asis", "--keep-layout", "-q")
    assert res.rc == 0, res.err
    assert json.loads((tmp_path / "asis" / "decoder.json").read_text())["layout"] == DYNAMIC_LAYOUT
    asis = Generator(str(tmp_path / "asis")).generate(prompt, max_new_tokens=24, stop_at_eos=False)
    assert asis.tokens[0].tolist() == ref.tolist()


def test_teacher_forced_logits_match_the_original_every_step(past_decoder, cli, tmp_path):
    """Each of 12 steps (a prompt of 4, then one token at a time) gives the original's logits
    within 1e-5 relative (the original run in ONNX Runtime with its own growing cache)."""
    _, path = past_decoder
    assert cli("export-decoder", path, "-o", tmp_path / "s", "--max-length", 32, "-q").rc == 0
    assert cli("export-decoder", path, "-o", tmp_path / "d", "--keep-layout", "-q").rc == 0
    ids = np.random.default_rng(2).integers(0, 320, (1, 16)).astype(np.int64)
    static, dynamic = Generator(str(tmp_path / "s")), Generator(str(tmp_path / "d"))
    static.reset(1)
    dynamic.reset(1)
    for chunk in [ids[:, :4]] + [ids[:, i:i + 1] for i in range(4, 16)]:
        a, b = static.step(chunk), dynamic.step(chunk)
        assert float(np.abs(a - b).max() / np.abs(b).max()) < 1e-5


def test_a_decoder_the_passes_do_not_recognize_is_kept_as_it_is(cli, tmp_path):
    """A past-key-values graph whose attention is already ONNX Runtime's GroupQueryAttention
    (nothing to recognize): exit 0, the original referenced, the reason in the manifest."""
    from decoder_helpers import tiny_model
    from passctl.passes.decoder.graph import build_decoder
    from passctl.passes.decoder.spec import spec_from_config

    model = tiny_model("llama", seed=4)
    spec = spec_from_config(model.config, model.generation_config)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    proto = build_decoder(spec, weights, model.model.rotary_emb.inv_freq.numpy(), 1.0, 64,
                          layout=DYNAMIC_LAYOUT)
    onnx.save(proto, str(tmp_path / "decoder.onnx"))
    res = cli("export-decoder", tmp_path / "decoder.onnx", "-o", tmp_path / "out", "-q")
    assert res.rc == 0, res.err
    manifest = json.loads((tmp_path / "out" / "decoder.json").read_text())
    assert manifest["layout"] == DYNAMIC_LAYOUT
    assert "KV cache found in layers []" in manifest["static_kv_refused"]


def test_keep_layout_for_a_weights_source_is_one_line_exit_2(cli, tmp_path):
    """--keep-layout names an .onnx option; given a GGUF path it is refused before any loading."""
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    res = cli("export-decoder", tmp_path / "m.gguf", "-o", tmp_path / "out", "--keep-layout")
    assert res.rc == 2
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and "--keep-layout applies to a decoder .onnx" in lines[0]
    assert "m.gguf" in lines[0] and not (tmp_path / "out").exists()
