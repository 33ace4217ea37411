"""The CUDA decoder artifact: ``passctl export-decoder SRC -o OUT --target h200`` and
``passctl generate`` / ``passctl.Generator`` on it (targets/tvm/cuda_generate.py).

This machine has no GPU: the whole path (CLI export, ``Generator(OUT)``, prefill, decode steps,
host sampling) runs under Triton's CPU interpreter in a subprocess (cuda_artifact_check.py,
``TRITON_INTERPRET=1`` set before Triton is imported; the runtime then keeps its tensors on the
CPU and captures no CUDA graph), with fp32 weights: the interpreter's fp16 would not reach 1e-5.
The CLI tests check the one-line refusals without the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("triton")
pytest.importorskip("safetensors")

from decoder_helpers import tiny_model, word_tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _cli(*args, **env):
    proc = subprocess.run([sys.executable, "-m", "passctl.tools.cli", *args], capture_output=True,
                          text=True, timeout=300, env=_env(**env))
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny tied Llama (transformers folder with a tokenizer) and its CUDA artifact (fp16)."""
    root = tmp_path_factory.mktemp("cuda")
    model = tiny_model("llama", seed=2)
    model.save_pretrained(str(root / "src"))
    word_tokenizer().save_pretrained(str(root / "src"))
    rc, out, err = _cli("export-decoder", str(root / "src"), "-o", str(root / "out"), "--target",
                        "h200", "--max-length", "48")
    assert rc == 0, err
    return model, root, out


def test_export_writes_the_manifest_weights_and_tokenizer(exported):
    import torch
    from safetensors.torch import load_file

    model, root, summary = exported
    out = root / "out"
    assert "passctl-cuda-triton for the h200" in summary
    assert "numeric check not run at export: the Triton decode step needs a CUDA GPU" in summary
    manifest = json.loads((out / "decoder.json").read_text())
    assert manifest["layout"] == "passctl-cuda-triton" and manifest["runtime"] == "cuda-triton"
    assert (manifest["target"], manifest["dtype"], manifest["wbits"], manifest["weight_layout"],
            manifest["max_length"], manifest["split"]) == ("h200", "float16", 16, "rows", 48, 16)
    assert manifest["config"] == {"num_hidden_layers": 2, "hidden_size": 64,
                                  "intermediate_size": 96, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320,
                                  "rms_norm_eps": model.config.rms_norm_eps}
    assert manifest["check"].startswith("not run at export")
    assert manifest["eos_token_ids"] == [319] and manifest["tokenizer"] == "tokenizer"
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    weights = load_file(str(out / "model.safetensors"))
    state = model.state_dict()
    # tied: the embedding is stored once (the decoder reads it as the LM head)
    assert set(weights) == (set(state) - {"lm_head.weight"}) | {"passctl.rotary.inv_freq"}
    for name, value in state.items():
        if name != "lm_head.weight":
            assert weights[name].dtype == torch.float16
            assert torch.equal(weights[name], value.half()), name
    assert torch.equal(weights["passctl.rotary.inv_freq"], model.model.rotary_emb.inv_freq)
    # safetensors writes 0600; the artifact's files all get the umask's permissions
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "decoder.json"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_generate_without_cuda_is_one_line_exit_2(exported):
    _, root, _ = exported
    rc, out, err = _cli("generate", str(root / "out"), "--prompt", "w5 w9")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"'{root / 'out'}' runs on a CUDA GPU (h200 target); torch sees no CUDA device: " \
           "run it on a GPU machine, or export for --target cpu" in err


def test_python_generator_without_cuda_raises_the_same_user_error(exported, monkeypatch):
    import torch

    import passctl
    from passctl.ir.errors import UserError

    _, root, _ = exported
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=r"runs on a CUDA GPU \(h200 target\); torch sees no CUDA"):
        passctl.Generator(str(root / "out"))


@pytest.mark.parametrize("case", ["bad_target", "qwen2", "gpt2", "onnx", "planes_fp16",
                                  "half2_fp16", "half2_block", "bf16_t4", "max_length"])
def test_export_refusals_are_one_line_exit_2(exported, tmp_path, case):
    _, root, _ = exported
    src, extra = str(root / "src"), []
    target = "h200"
    if case == "bad_target":
        target, expect = "h201", "unknown target 'h201': did you mean 'h200'"
    elif case == "qwen2":
        tiny_model("qwen2").save_pretrained(str(tmp_path / "qwen2"))
        src = str(tmp_path / "qwen2")
        expect = "the CUDA decoder runs llama, mistral models without projection biases " \
                 "('qwen2' is not); export it for --target cpu"
    elif case == "gpt2":
        (tmp_path / "gpt2").mkdir()
        (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
        src, expect = str(tmp_path / "gpt2"), "model type 'gpt2' has no decoder layout"
    elif case == "onnx":
        (tmp_path / "m.onnx").write_bytes(b"")
        src, expect = str(tmp_path / "m.onnx"), "the CUDA artifact is built from a GGUF file"
    elif case == "planes_fp16":
        extra, expect = ["--weight-layout", "planes"], "applies to --weights int8 / int4"
    elif case == "half2_fp16":
        extra, expect = ["--weight-layout", "half2"], "half2 applies to --weights int8 / int4"
    elif case == "half2_block":  # 8 divides the tiny model's inputs; half2's tiles need >= 16
        extra = ["--weights", "int4", "--block", "8", "--weight-layout", "half2"]
        expect = "half2 needs an int4 --block that is a power of two >= 16 (got 8)"
    elif case == "bf16_t4":
        target, extra, expect = "t4", ["--dtype", "bf16"], "the t4 has no bf16"
    else:
        extra, expect = ["--max-length", "40"], "needs a multiple of 16 (e.g. 48)"
    rc, _, err = _cli("export-decoder", src, "-o", str(tmp_path / "o"), "--target", target,
                      "--max-length", "48", *extra)
    assert rc == 2 and expect in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_gpu_profiles_carry_their_datasheet_bandwidth_and_the_result_its_fraction():
    from passctl.support.profiles import get_target, list_targets
    from passctl.targets.onnxruntime.generate import GenerationResult

    assert get_target("h200").memory_bandwidth == 4.8e12
    assert get_target("h100").memory_bandwidth == 3.35e12
    assert all((p.memory_bandwidth is not None) == p.is_gpu for p in list_targets())
    # 10 decode steps in 0.1 s = 100 tokens/s; 1 GB per step -> 100 GB/s of 4.8 TB/s
    result = GenerationResult(tokens=np.zeros((1, 11), np.int64), prompt_tokens=3,
                              time_to_first_token_s=0.01, decode_s=0.1, weight_bytes=10**9,
                              memory_bandwidth=4.8e12)
    assert result.bandwidth_fraction == pytest.approx(100e9 / 4.8e12, rel=1e-12)
    assert np.isnan(GenerationResult(tokens=np.zeros((1, 11), np.int64), prompt_tokens=3,
                                     time_to_first_token_s=0.01, decode_s=0.1).bandwidth_fraction)


def _interpret(mode: str, root) -> dict:
    proc = subprocess.run([sys.executable, os.path.join(HERE, "cuda_artifact_check.py"), mode,
                           str(root)], env=_env(TRITON_INTERPRET="1"), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_cuda_artifact_generates_transformers_greedy_tokens_under_the_interpreter(tmp_path):
    """CLI export (fp32) -> passctl.Generator(OUT) -> a CudaGenerator: greedy tokens read at the
    end, per step and streamed all equal transformers' greedy tokens; teacher-forced logits
    (reset + step) and the logits ``return_logits`` keeps within 1e-5 of transformers'; sampled
    tokens (temperature 1.5, top-p 0.95, seed 7: host sampler) equal the ONNX Runtime artifact's;
    device-sampled tokens (temperature only) are the same read per step or at the end; the fp16
    artifact gives the same greedy tokens, logits within 5e-3."""
    r = _interpret("greedy", tmp_path)
    assert r["generator"] == "CudaGenerator"
    assert len(set(r["ref_tokens"])) >= 2, r  # not one repeated token
    assert r["deferred"] == r["per_step"] == r["streamed"] == r["ref_tokens"], r
    assert r["forced_rel"] < 1e-5 and r["returned_rel"] < 1e-5, r
    # the default fp16 artifact: the same tokens, logits within fp16 rounding (measured 7e-4)
    assert r["fp16_tokens"] == r["ref_tokens"] and 1e-5 < r["fp16_rel"] < 5e-3, r
    assert len(set(r["sampled"])) > 4 and r["sampled"] == r["ort_sampled"], r
    # temperature alone: sampled on the device, the same draws whether read per step or at the
    # end, others for another seed
    assert len(set(r["on_device"])) > 4 and r["on_device"] == r["on_device_streamed"], r
    assert r["other_seed"] != r["on_device"], r
    # fp32: 2 layers of (64 x 128 qkv, 64 x 64 o, 192 x 64 gate/up, 64 x 96 down) + 320 x 64 head
    # + one embedding row, 4 bytes each
    per_layer = 128 * 64 + 64 * 64 + 192 * 64 + 64 * 96
    assert r["weight_bytes"] == 4 * (2 * per_layer + 320 * 64 + 64)
    assert r["fraction"] == pytest.approx(r["weight_bytes"] * r["tokens_per_s"] / 4.8e12)


@pytest.mark.slow
def test_device_sampler_draws_from_softmax_over_temperature():
    """gumbel_sample_kernel at 2000 counters: each token's frequency within 4 standard errors of
    softmax(logits / T) (numpy), and the same counter and seed draw the same token again."""
    r = _interpret("gumbel", "unused")
    p, freq, n = np.array(r["p"]), np.array(r["freq"]), r["n"]
    assert freq[7] == 0  # never the masked tail of the last block
    assert np.all(np.abs(freq[:7] - p) <= 4 * np.sqrt(p * (1 - p) / n)), (freq, p)
    assert r["repeat_same"]


@pytest.mark.slow
def test_cuda_artifact_int8_code_planes_equal_transformers_on_the_same_weights(tmp_path):
    """--weights int8 --weight-layout planes (quantized at load): every projection and the LM head
    in code planes; tokens and teacher-forced logits against transformers' fp32 model holding the
    same round-to-nearest int8 weights, dequantized."""
    r = _interpret("int8", tmp_path)
    assert r["layouts"] == ["planes"]
    assert r["tokens"] == r["ref_tokens"], r
    assert r["forced_rel"] < 1e-5, r


@pytest.mark.slow
def test_passctl_generate_streams_the_cuda_artifact_under_the_interpreter(exported, tmp_path):
    """`passctl generate` on a CUDA artifact (fp32, Triton's interpreter): the streamed words are
    transformers' greedy tokens; the timing line names the device and the bandwidth fraction."""
    import torch

    model, root, _ = exported
    out = str(tmp_path / "out32")
    rc, _, err = _cli("export-decoder", str(root / "src"), "-o", out, "--target", "h200",
                      "--max-length", "32", "--dtype", "fp32", "-q")
    assert rc == 0, err
    rc, text, err = _cli("generate", out, "--prompt", "w5 w9 w13", "--max-new-tokens", "5",
                         "--ignore-eos", TRITON_INTERPRET="1")
    assert rc == 0, err
    with torch.no_grad():
        ref = model.generate(torch.tensor([[5, 9, 13]]), max_new_tokens=5, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, 3:].tolist()
    assert [int(w[1:]) for w in text.split()] == ref
    assert "tokens/s (decode, cuda, h200 target), weights read at" in err
    assert "of the h200's 4800 GB/s)" in err


def test_device_sampler_compiles_for_sm_90():
    """gumbel_sample_kernel (tl.rand keyed by a seed read from memory) through Triton's compiler
    to PTX for the H100 / H200 (no GPU needed): the Philox rounds (mul.hi) are in it."""
    import triton
    from triton.backends.compiler import GPUTarget

    from passctl.targets.tvm import triton_decode as K

    signature = {"logits_ptr": "*fp32", "seed_ptr": "*i32", "inv_temp_ptr": "*fp32",
                 "tok_ptr": "*i32", "out_tokens_ptr": "*i32", "step_ptr": "*i32",
                 "V": "constexpr", "BLOCK": "constexpr"}
    source = triton.compiler.ASTSource(fn=K.gumbel_sample_kernel, signature=signature,
                                       constexprs={"V": 32000, "BLOCK": 1024})
    ptx = triton.compiler.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4}).asm["ptx"]
    assert ".entry gumbel_sample_kernel" in ptx and ptx.count("mul.hi") >= 10
