"""What every decoder-artifact runtime shares (the ONNX Runtime one, targets/onnxruntime/generate.py,
and the CUDA one, targets/tvm/cuda_generate.py): the manifest ``decoder.json``, the artifact's
tokenizer, the request checks, host-side sampling and :class:`GenerationResult`
(docs/generate.md)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from passctl.ir.errors import UserError
from passctl.passes.decoder.layout import DYNAMIC_LAYOUT, STATIC_LAYOUT
from passctl.passes.decoder.spec import CUDA_LAYOUT

MANIFEST = "decoder.json"


def read_manifest(folder: str) -> dict:
    """The ``decoder.json`` of artifact ``folder``.

    Raises:
        UserError: ``folder`` is missing, has no ``decoder.json`` (not a decoder artifact), or
            the manifest is not valid JSON / names an unknown layout.
    """
    if os.path.isfile(folder):
        raise UserError(f"'{folder}' is a file, not a decoder artifact; make one with "
                        f"`passctl export-decoder {folder} -o OUT` and give OUT")
    if not os.path.isdir(folder):
        raise UserError(f"'{folder}' not found; give the output folder of "
                        "`passctl export-decoder`")
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise UserError(f"'{folder}' has no {MANIFEST}: not a decoder artifact (make one with "
                        "`passctl export-decoder MODEL -o OUT`)")
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable manifest ({e}); export the decoder again") from None
    if manifest.get("layout") not in (STATIC_LAYOUT, DYNAMIC_LAYOUT, CUDA_LAYOUT):
        raise UserError(f"{path}: unknown decoder layout '{manifest.get('layout')}'; export the "
                        "decoder again with this passctl")
    return manifest


def load_tokenizer(folder: str):
    """The tokenizer in artifact ``folder``'s ``tokenizer/`` (a ``tokenizers.Tokenizer`` read from
    ``tokenizer.json``; no transformers import).

    Raises:
        UserError: the artifact has no tokenizer (export it with one, or pass token ids).
    """
    manifest = read_manifest(folder)
    sub = manifest.get("tokenizer")
    path = os.path.join(folder, sub, "tokenizer.json") if sub else None
    if not path or not os.path.isfile(path):
        raise UserError(f"'{folder}' has no tokenizer (tokenizer/tokenizer.json); export with a "
                        "model that ships one, or pass token ids")
    import tokenizers

    return tokenizers.Tokenizer.from_file(path)


@dataclass
class GenerationResult:
    """What :meth:`Generator.generate` returns.

    Attributes:
        tokens: int64 ``[batch, new]``, the generated ids (not the prompt); rows stop at an end
            token only when every row has ended (batch 1: right after its end token).
        logits: float32 ``[batch, new, vocab]``, the logits each token was chosen from (only
            with ``return_logits=True``; else None).
        prompt_tokens: prompt length.
        time_to_first_token_s: seconds from the call to the first token (prefill + choice).
        decode_s: seconds of the decode steps after the first token.
        weight_bytes: bytes of weights one decode step reads (None: not known).
        memory_bandwidth: the device's peak memory bandwidth in bytes/s (the CUDA artifact's
            target profile, ``support/profiles.py``; None on the CPU).
    """

    tokens: np.ndarray
    prompt_tokens: int
    time_to_first_token_s: float
    decode_s: float
    logits: Optional[np.ndarray] = None
    step_s: List[float] = field(default_factory=list)
    weight_bytes: Optional[int] = None
    memory_bandwidth: Optional[float] = None

    @property
    def ms_per_token(self) -> float:
        """Mean milliseconds per decode step after the first token (nan with one token)."""
        n = self.tokens.shape[1] - 1
        return 1000.0 * self.decode_s / n if n > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second after the first token (nan with one token)."""
        n = self.tokens.shape[1] - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else float("nan")

    @property
    def bandwidth_fraction(self) -> float:
        """Weight bytes per decode step / seconds per step / peak memory bandwidth: the fraction
        of the bandwidth the decode steps use to stream the weights (nan when a size is not
        known; the KV cache and activations are not counted)."""
        if not self.weight_bytes or not self.memory_bandwidth:
            return float("nan")
        return self.weight_bytes * self.tokens_per_s / self.memory_bandwidth


def choose_token(logits: np.ndarray, temperature: float, top_p: float,
            rng: Optional[np.random.Generator]) -> np.ndarray:
    """Next ids ``[batch]`` from float logits ``[batch, vocab]``: argmax when ``temperature`` is 0,
    else a draw from softmax(logits / temperature) restricted to the smallest set of top tokens
    whose probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020)."""
    if temperature == 0:
        return np.argmax(logits, axis=-1).astype(np.int64)
    out = np.empty(logits.shape[0], np.int64)
    for row in range(logits.shape[0]):
        z = logits[row].astype(np.float64) / temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        if top_p < 1.0:
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, top_p) + 1)]
        else:
            keep = order
        q = p[keep] / p[keep].sum()
        out[row] = keep[rng.choice(len(keep), p=q)]
    return out

def check_request(ids, max_new_tokens: int, temperature: float, top_p: float,
                  manifest: dict) -> np.ndarray:
    """The prompt ``ids`` as an integer ``[batch, tokens]`` array, once the request of
    ``generate`` is valid for the artifact of ``manifest``.

    Raises:
        UserError: empty prompt, ids outside the vocabulary, ``max_new_tokens`` < 1, temperature
            < 0 or top_p outside (0, 1], or prompt plus ``max_new_tokens`` longer than the cache.
    """
    prompt = np.asarray(ids)
    if prompt.ndim == 1:
        prompt = prompt[None, :]
    if prompt.ndim != 2 or prompt.shape[1] == 0 or not np.issubdtype(prompt.dtype, np.integer):
        raise UserError(f"prompt ids of shape {prompt.shape} and dtype {prompt.dtype}: give a "
                        "non-empty list of token ids ([tokens] or [batch, tokens])")
    if int(max_new_tokens) < 1:
        raise UserError(f"max_new_tokens {max_new_tokens}: give at least 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise UserError(f"temperature {temperature} / top_p {top_p}: give temperature >= 0 "
                        "and 0 < top_p <= 1")
    vocab = int(manifest["vocab_size"])
    if prompt.min() < 0 or prompt.max() >= vocab:
        raise UserError(f"prompt ids must lie in [0, {vocab}); got {prompt.min()} .. "
                        f"{prompt.max()}")
    need = prompt.shape[1] + int(max_new_tokens) - 1
    limit = manifest.get("max_length")
    if limit is not None and need > int(limit):
        raise UserError(f"prompt of {prompt.shape[1]} tokens plus {max_new_tokens} new tokens "
                        f"needs a cache of {need}, the artifact's holds {limit}; "
                        "shorten the prompt, ask for fewer tokens or export with a larger "
                        "--max-length")
    return prompt


__all__ = ["MANIFEST", "GenerationResult", "check_request", "choose_token", "load_tokenizer",
           "read_manifest"]
