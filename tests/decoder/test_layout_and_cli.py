"""Decoder ONNX as users have it (past_key_values.N.key / present.N.key), layout refusals, and the
``passctl export-decoder`` / ``passctl generate`` command lines (streaming, one-line errors)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from decoder_helpers import tiny_model, word_tokenizer
from passctl.ir.errors import UserError
from passctl.passes.decoder.graph import DYNAMIC_LAYOUT, build_decoder
from passctl.passes.decoder.layout import detect_layout
from passctl.passes.decoder.spec import spec_from_config
from passctl.targets.onnxruntime.generate import Generator
from passctl.tools.cli import main
from passctl.tools.export_decoder import export_from_transformers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = tiny_model("llama", seed=4)
    root = tmp_path_factory.mktemp("tiny")
    export_from_transformers(model, word_tokenizer(), str(root / "out"), max_length=24)
    return model, root


def _user_decoder(model, folder):
    """``folder/decoder.onnx`` in the Optimum / onnxruntime-genai layout, with tokenizer.json."""
    spec = spec_from_config(model.config, model.generation_config)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    proto = build_decoder(spec, weights, model.model.rotary_emb.inv_freq.numpy(), 1.0, 64,
                          layout=DYNAMIC_LAYOUT)
    folder.mkdir(exist_ok=True)
    onnx.save(proto, str(folder / "decoder.onnx"))
    word_tokenizer().save_pretrained(str(folder))
    return str(folder / "decoder.onnx")


def test_user_past_key_values_decoder_generates_transformers_tokens(tiny, tmp_path):
    model, _ = tiny
    path = _user_decoder(model, tmp_path / "user")
    layout = detect_layout(onnx.load(path, load_external_data=False))
    assert (layout.layout, layout.num_layers, layout.num_kv_heads, layout.head_dim) == \
        (DYNAMIC_LAYOUT, 2, 2, 16)
    assert main(["export-decoder", path, "-o", str(tmp_path / "out"), "-q"]) == 0
    prompt = np.array([[9, 8, 7, 6]], np.int64)
    with torch.no_grad():
        ref = model.generate(torch.from_numpy(prompt), max_new_tokens=20, do_sample=False,
                             eos_token_id=None, pad_token_id=0).numpy()[0, 4:]
    got = Generator(str(tmp_path / "out")).generate(prompt, max_new_tokens=20, stop_at_eos=False)
    assert got.tokens[0].tolist() == ref.tolist()


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _graph_model(inputs, outputs):
    nodes = [helper.make_node("Identity", [inputs[0].name], [o.name]) for o in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case,message", [
    ("no_ids", "no decoder layout .needs an input 'input_ids'"),
    ("no_cache", "no KV cache"),
    ("half_cache", "incomplete"),
    ("fp16_cache", "only float32"),
])
def test_layouts_without_a_decoder_are_refused_in_one_line(case, message):
    f, h = TensorProto.FLOAT, TensorProto.FLOAT16
    ids = _vi("input_ids", TensorProto.INT64, ["b", "s"])
    mask = _vi("attention_mask", TensorProto.INT64, ["b", "t"])
    logits = _vi("logits", f, ["b", "s", 10])
    cache = lambda n, e=f: _vi(n, e, ["b", 2, "p", 4])  # noqa: E731
    if case == "no_ids":
        model = _graph_model([_vi("pixel_values", f, [1, 3])], [logits])
    elif case == "no_cache":
        model = _graph_model([ids, mask], [logits])
    elif case == "half_cache":
        model = _graph_model([ids, mask, cache("past_key_values.0.key")],
                             [logits, cache("present.0.key")])
    else:
        model = _graph_model([ids, mask, cache("past_key_values.0.key", h),
                              cache("past_key_values.0.value", h)],
                             [logits, cache("present.0.key", h), cache("present.0.value", h)])
    with pytest.raises(UserError, match=message) as info:
        detect_layout(model, name="m.onnx")
    assert "\n" not in str(info.value) and str(info.value).startswith("m.onnx: ")


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "passctl.tools.cli", *args], capture_output=True,
                          text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_generate_streams_text_and_reports_speed(tiny):
    _, root = tiny
    rc, out, err = _cli("generate", str(root / "out"), "--prompt", "w5 w9 w13",
                        "--max-new-tokens", "6", "--ignore-eos")
    assert rc == 0, err
    words = out.split()
    assert len(words) == 6 and all(w.startswith("w") for w in words)
    ids = [int(w[1:]) for w in words]
    expect = Generator(str(root / "out")).generate([5, 9, 13], max_new_tokens=6,
                                                   stop_at_eos=False).tokens[0].tolist()
    assert ids == expect
    assert "time to first token" in err and "tokens/s" in err
    assert "end-of-sequence" not in err  # --ignore-eos: all 6 came


def test_generate_says_when_it_stopped_at_the_end_of_sequence_token():
    from passctl.tools.generate import stop_note

    manifest = {"eos_token_ids": [2, 7]}
    assert stop_note([5, 9, 7], 64, manifest) == (
        "; stopped at the end-of-sequence token after 3 of 64 (--ignore-eos goes on)")
    assert stop_note([5, 9, 4], 3, manifest) == ""      # the limit, not the end token
    assert stop_note([5, 9, 4], 64, manifest) == ""     # ended otherwise (no end token last)
    assert stop_note([2], 1, manifest) == ""            # the end token exactly at the limit


@pytest.mark.parametrize("case", ["missing_file", "not_utf8", "folder", "empty", "too_long",
                                  "no_artifact"])
def test_generate_errors_are_one_line_exit_2(tiny, tmp_path, case):
    _, root = tiny
    out = str(root / "out")
    args = ["generate", out, "--prompt-file", str(tmp_path / "missing.txt")]
    expect = "not found"
    if case == "not_utf8":
        (tmp_path / "p.txt").write_bytes(b"\xff\xfe\x00bad")
        args, expect = ["generate", out, "--prompt-file", str(tmp_path / "p.txt")], "not UTF-8"
    elif case == "folder":
        args, expect = ["generate", out, "--prompt-file", str(tmp_path)], "is a folder"
    elif case == "empty":
        (tmp_path / "p.txt").write_text("  \n")
        args, expect = ["generate", out, "--prompt-file", str(tmp_path / "p.txt")], "empty"
    elif case == "too_long":
        args = ["generate", out, "--prompt", " ".join(f"w{i}" for i in range(20)),
                "--max-new-tokens", "8"]
        expect = "the prompt has 20 tokens; with --max-new-tokens 8 it needs a cache of 27"
    elif case == "no_artifact":
        args, expect = ["generate", str(tmp_path), "--prompt", "w1"], "not a decoder artifact"
    rc, stdout, err = _cli(*args)
    assert rc == 2 and expect in err and len(err.strip().splitlines()) == 1, err
    assert stdout == ""


def test_export_decoder_refuses_a_model_without_decoder_layout(tmp_path):
    f = TensorProto.FLOAT
    model = _graph_model([_vi("input_ids", TensorProto.INT64, ["b", "s"]),
                          _vi("attention_mask", TensorProto.INT64, ["b", "s"])],
                         [_vi("logits", f, ["b", "s", 10])])
    onnx.save(model, str(tmp_path / "nocache.onnx"))
    rc, _, err = _cli("export-decoder", str(tmp_path / "nocache.onnx"), "-o", str(tmp_path / "o"))
    assert rc == 2 and "no KV cache" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_export_decoder_refuses_an_unsupported_architecture(tmp_path):
    import json

    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    rc, _, err = _cli("export-decoder", str(tmp_path / "gpt2"), "-o", str(tmp_path / "o"))
    assert rc == 2 and "model type 'gpt2' has no decoder layout" in err, err
    assert len(err.strip().splitlines()) == 1


def test_genai_shared_buffer_decoder_is_refused(tiny, tmp_path):
    import json

    model, _ = tiny
    path = _user_decoder(model, tmp_path / "genai")
    (tmp_path / "genai" / "genai_config.json").write_text(
        json.dumps({"search": {"past_present_share_buffer": True}}))
    rc, _, err = _cli("export-decoder", path, "-o", str(tmp_path / "o"))
    assert rc == 2 and "past_present_share_buffer" in err and len(err.strip().splitlines()) == 1
