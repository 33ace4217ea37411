"""``export-decoder --weights int4|int8`` on tiny random transformers decoders: the artifact's
projections and LM head become MatMulNBits, it generates, and its logits stay near the float32
artifact's (transformers eager on the same weights is the reference of the float32 check)."""

from __future__ import annotations

import json
import os
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
    # the rewritten weights file gets the umask's permissions like every other file (onnx writes
    # external data 0600)
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.onnx", "model.onnx.data", "decoder.json"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_onnx_source_with_weights_is_refused(tmp_path):
    import argparse

    from passctl.tools import export_decoder

    args = argparse.Namespace(model=str(tmp_path / "decoder.onnx"), out=str(tmp_path / "o"),
                              max_length=16, tokenizer=None, quiet=True, weights="int4",
                              block=None, asymmetric=False)
    (tmp_path / "decoder.onnx").write_bytes(b"")
    with pytest.raises(UserError, match="--weights int4 applies to GGUF / transformers"):
        export_decoder.main(args, None)


@pytest.mark.parametrize("extra,message", [
    (dict(ppl_budget=0.03, calib_text=None), "need --weights int4|int8 and --calib-text"),
    (dict(ppl_budget=0.03, calib_text="/nonexistent/calib.txt"), "calib.txt: No such file"),
    (dict(awq=True, calib_text=None, weights="fp32"), "need --weights int4|int8"),
])
def test_budget_flags_are_checked_before_the_model_loads(tmp_path, extra, message):
    """A bad --ppl-budget / --awq / --calib-text is refused before the (slow) model load: the model
    here is an empty .gguf that transformers could not load, so the flag's line must come
    first."""
    import argparse

    from passctl.tools import export_decoder

    (tmp_path / "m.gguf").write_bytes(b"")
    fields = dict(model=str(tmp_path / "m.gguf"), out=str(tmp_path / "o"), max_length=16,
                  tokenizer=None, quiet=True, weights="int4", block=None, asymmetric=False,
                  keep_layout=False, ppl_budget=None, awq=False, calib_text=None,
                  fallback="int8")
    fields.update(extra)
    with pytest.raises(UserError, match=message):
        export_decoder.main(argparse.Namespace(**fields), None)
    assert not (tmp_path / "o").exists()


def _session_without_optimization(gen, path):
    """Give ``gen`` a session at ORT_DISABLE_ALL (ONNX Runtime would otherwise fuse DQ -> MatMul
    into MatMulNBits with int8 activations: its CPU shortcut, not what the graph says)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    gen.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    gen._input_names = {i.name for i in gen.session.get_inputs()}
    return gen


def _logits(folder, ids):
    gen = _session_without_optimization(Generator(str(folder)), folder / "model.onnx")
    gen.reset(1)
    gen.step(ids[:, :5])
    return gen.step(ids[:, 5:6])[0]


def test_tensorrt_form_on_a_tiny_llama_decoder(tmp_path):
    """quantize-weights{bits=8} for h100 / tensorrt over a tiny Llama decoder graph: its 9
    projections and LM head become int8 DequantizeLinear -> MatMul (the decoder keeps its ONNX
    Runtime contrib attention, so only the pass is tested here, not a TensorRT artifact); ONNX
    Runtime's logits equal those of the same graph with numpy-dequantized float weights, stay
    near the float32 artifact's, and int4 (opset 21 needed) refuses in one line because onnx's
    version converter has no schema for the contrib ops."""
    import shutil

    from onnx import numpy_helper

    from passctl.ir import load, save, to_onnx
    from passctl.passes.quantize.weights import QuantizeWeights
    from passctl.support.context import CompileContext
    from passctl.support.profiles import get_target

    fp32 = tmp_path / "fp32"
    export_from_transformers(tiny_model("llama", seed=1, intermediate_size=128), word_tokenizer(),
                             str(fp32), max_length=32)
    quant, deq = tmp_path / "int8", tmp_path / "deq"
    shutil.copytree(fp32, quant)
    model = load(str(fp32 / "model.onnx"))
    p = QuantizeWeights(bits=8)
    p.configure(CompileContext(target=get_target("h100"), emitter="tensorrt"))
    stats = p.run(model).stats
    assert stats["quantized_layers"] == 9 and stats["form"] == "DequantizeLinear+MatMul"
    (quant / "model.onnx").unlink()
    save(model, str(quant / "model.onnx"), external_data=False)
    proto = onnx.load(str(quant / "model.onnx"))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("DequantizeLinear") == 9 and "Gemm" not in ops
    # the reference: each DequantizeLinear's output computed in numpy, as a float initializer
    inits = {t.name: t for t in proto.graph.initializer}
    ref = onnx.ModelProto()
    ref.CopyFrom(proto)
    del ref.graph.node[:]
    for n in proto.graph.node:
        if n.op_type != "DequantizeLinear":
            ref.graph.node.append(n)
            continue
        q = numpy_helper.to_array(inits[n.input[0]]).astype(np.float64)
        s = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        ref.graph.initializer.append(numpy_helper.from_array((q * s[None, :]).astype(np.float32),
                                                             n.output[0]))
    shutil.copytree(fp32, deq)
    (deq / "model.onnx").unlink()
    onnx.save(ref, str(deq / "model.onnx"))
    ids = np.array([[1, 42, 7, 100, 99, 3]], np.int64)
    got, want, base = (_logits(f, ids) for f in (quant, deq, fp32))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    err = float(np.abs(got - base).max() / np.abs(base).max())
    assert 0 < err < 0.03  # int8 per channel against float32 (the MatMulNBits test's bound)
    p4 = QuantizeWeights(bits=4, block=64)
    p4.configure(CompileContext(target=get_target("h100"), emitter="tensorrt"))
    with pytest.raises(UserError) as e:
        p4.run(load(str(fp32 / "model.onnx")))
    assert "needs opset >= 21 but the model has opset 17" in str(e.value)
    assert "\n" not in str(e.value)
