"""``passctl export-decoder MODEL -o OUT --target h200``: the CUDA decoder artifact.

OUT gets ``decoder.json`` (layout ``passctl-cuda-triton``: the target, the sizes the Triton decode
step needs, cache length, weight dtype and quantization), ``model.safetensors`` (transformers' state
dict in fp16 / bf16 / fp32, plus the rotary frequencies) and ``tokenizer/``. It runs on a CUDA GPU
with ``passctl generate`` / ``passctl.Generator`` (``passctl.targets.tvm.cuda_generate``);
docs/generate.md, "On a GPU: the CUDA artifact".
"""

from __future__ import annotations

import os
from typing import Optional

from passctl.ir.errors import UserError

#: ``--dtype`` -> the torch dtype name of the stored weights
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}

WEIGHTS_FILE = "model.safetensors"

#: ``--weights`` -> bits of the decode step's projection weights (16: as stored)
WBITS = {"fp32": 16, "int8": 8, "int4": 4}

#: why the CUDA artifact is written without the export's numeric check (manifest ``check``)
NO_CHECK = ("not run at export: the Triton decode step needs a CUDA GPU (its kernels are checked "
            "on the CPU under Triton's interpreter by tests/decoder/test_cuda_artifact.py)")


def _split(max_length: int) -> int:
    """Cache rows per decode-attention program: the largest power of two <= 64 dividing
    ``max_length`` that leaves at least 2 chunks."""
    split = 64
    while split > 1 and (max_length % split or max_length // split < 2):
        split //= 2
    return split


def check_quantization(spec, weights: str, block: Optional[int], layout: Optional[str]) -> None:
    """Refuse ``--weights`` / ``--block`` / ``--weight-layout`` the CUDA decoder cannot build,
    before any weight is loaded (``spec`` from the model's config).

    Raises:
        UserError: as :func:`_quantization`.
    """
    _quantization(spec, WBITS[weights], block, layout)


def _quantization(spec, wbits: int, block: Optional[int], layout: Optional[str]):
    """``(group, layout)`` for ``wbits``; refuses what :class:`TritonDecoder` cannot build.

    Raises:
        UserError: a group that does not divide the projections' inputs, or ``planes`` where its
            blocks do not fit (int4: group >= 128; int8: inputs a multiple of 64), ``half2``
            where its 64-bit words do not (inputs a multiple of 64 / bits), or either with
            float weights.
    """
    group = int(block) if block else 128
    if wbits == 16:
        if layout in ("planes", "half2"):
            raise UserError(f"--weight-layout {layout} applies to --weights int8 / int4")
        return group, "rows"
    inputs = (spec.hidden_size, spec.intermediate_size, spec.num_heads * spec.head_dim)
    if wbits == 4 and (group % 2 or any(k % group for k in inputs)):
        raise UserError(f"--block {group}: int4 groups must divide the projections' inputs "
                        f"{', '.join(map(str, sorted(set(inputs))))}")
    planes_ok = group >= 128 if wbits == 4 else all(k % 64 == 0 for k in inputs)
    if layout is None:  # int4: code planes (faster on the H200/H100), int8: byte rows
        layout = "planes" if wbits == 4 and planes_ok else "rows"
    if layout == "planes" and not planes_ok:
        raise UserError("--weight-layout planes needs int4 groups of >= 128 (--block) or int8 "
                        "inputs that are multiples of 64; use --weight-layout rows")
    if layout == "half2" and any(k % (64 // wbits) for k in inputs):
        raise UserError(f"--weight-layout half2 needs the projections' inputs to be multiples of "
                        f"{64 // wbits} (int{wbits}); use --weight-layout rows")
    if layout == "half2" and wbits == 4 and (group < 16 or group & (group - 1)):
        raise UserError(f"--weight-layout half2 needs an int4 --block that is a power of two "
                        f">= 16 (got {group}); use --weight-layout rows")
    return group, layout


def check_dtype(target, dtype: str) -> None:
    """Refuse a weight dtype the GPU ``target`` has no fast path for (bf16 before Ampere).

    Raises:
        UserError: bf16 on a target without it (one line).
    """
    if dtype == "bf16" and not target.supports("bf16"):
        raise UserError(f"--dtype bf16: the {target.name} has no bf16; give --dtype fp16")


def export_cuda(model, tokenizer, out: str, target, max_length: int, dtype: str = "fp16",
                weights: str = "fp32", block: Optional[int] = None,
                weight_layout: Optional[str] = None, source: str = "") -> dict:
    """Write the CUDA decoder artifact of transformers decoder ``model`` into ``out``.

    Args:
        model: a ``*ForCausalLM`` of a family :func:`check_cuda_decoder` accepts.
        tokenizer: its transformers tokenizer (saved into ``out/tokenizer``) or None.
        target: the GPU :class:`~passctl.support.profiles.TargetProfile`.
        dtype: ``fp16`` / ``bf16`` / ``fp32``: the stored weights (and the decode step's).
        weights: ``fp32`` (float projections) or ``int8`` / ``int4``: weight-only RTN quantization
            done when the artifact is loaded (the file holds the float weights).
        block: the int4 group (default 128).
        weight_layout: ``rows`` / ``planes`` (None: planes for int4, rows otherwise).

    Returns:
        The manifest written to ``out/decoder.json``.

    Raises:
        UserError: the model, ``max_length``, dtype or quantization is not supported there.
    """
    import torch
    from safetensors.torch import save_file

    from passctl.passes.decoder.spec import CUDA_LAYOUT, check_cuda_decoder, spec_from_config
    from passctl.targets.tvm.cuda_generate import INV_FREQ
    from passctl.tools.decoder_output import (make_readable, prepare_out, save_tokenizer, staged,
                                              write_manifest)

    prepare_out(out)
    name = source or type(model).__name__
    spec = spec_from_config(model.config, getattr(model, "generation_config", None), name=name)
    check_cuda_decoder(spec, model.config, max_length, name=name)
    check_dtype(target, dtype)
    wbits = WBITS[weights]
    group, layout = _quantization(spec, wbits, block, weight_layout)
    rotary = model.model.rotary_emb
    if float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
        raise UserError(f"{name}: its rope scaling multiplies cos/sin by "
                        f"{float(rotary.attention_scaling):g}, which the CUDA decode step does "
                        "not; export it for --target cpu")
    torch_dtype = getattr(torch, DTYPES[dtype])
    state = {k: v.detach().to(torch_dtype).contiguous() for k, v in model.state_dict().items()
             if not k.endswith("rotary_emb.inv_freq")}
    if spec.tie_word_embeddings:  # one copy: TritonDecoder reads the embedding as the LM head
        state.pop("lm_head.weight", None)
    state[INV_FREQ] = rotary.inv_freq.detach().float().contiguous()
    with staged(out) as tmp:
        save_file(state, os.path.join(tmp, WEIGHTS_FILE))
        make_readable(os.path.join(tmp, WEIGHTS_FILE))
        del state
        manifest = {
            "format": 1, "layout": CUDA_LAYOUT, "runtime": "cuda-triton", "target": target.name,
            "weights_file": WEIGHTS_FILE, "dtype": DTYPES[dtype], "wbits": wbits, "group": group,
            "weight_layout": layout, "split": _split(max_length), "max_length": max_length,
            "num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "vocab_size": spec.vocab_size,
            "eos_token_ids": list(spec.eos_token_ids), "source": source, "spec": spec.to_json(),
            "config": {"num_hidden_layers": spec.num_layers, "hidden_size": spec.hidden_size,
                       "intermediate_size": spec.intermediate_size,
                       "num_attention_heads": spec.num_heads,
                       "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                       "vocab_size": spec.vocab_size, "rms_norm_eps": spec.rms_norm_eps},
            "tokenizer": save_tokenizer(tokenizer, tmp), "check": NO_CHECK,
            "weight_bytes": os.path.getsize(os.path.join(tmp, WEIGHTS_FILE))}
        write_manifest(tmp, manifest)
    return manifest


__all__ = ["DTYPES", "NO_CHECK", "check_dtype", "export_cuda"]
