"""Which decoder layout an existing ONNX model has (docs/generate.md, "Accepted layouts")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List

import onnx

from passctl.ir.errors import UserError
from passctl.passes.decoder.graph import DYNAMIC_LAYOUT
from passctl.passes.decoder.graph import LAYOUT as STATIC_LAYOUT

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")


@dataclass(frozen=True)
class DecoderLayout:
    """A recognized decoder ONNX layout.

    Attributes:
        layout: ``passctl-static-kv`` or ``past-key-values``.
        num_layers: number of ``past_key_values.N.key`` inputs.
        num_kv_heads, head_dim: the cache's axes 1 and 3 (0: symbolic in the model).
        vocab_size: the last axis of ``logits`` (0: symbolic).
        max_length: the static cache length (``passctl-static-kv`` only; else None).
    """

    layout: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_length: object = None


def _dims(value_info) -> List[object]:
    dims = []
    for d in value_info.type.tensor_type.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?"))
    return dims


def detect_layout(model: onnx.ModelProto, name: str = "model") -> DecoderLayout:
    """The :class:`DecoderLayout` of ``model`` (its weights need not be loaded).

    Accepted: passctl's own static cache (metadata ``passctl.layout``), and the layout of
    Optimum / onnxruntime-genai decoders: inputs ``input_ids`` int64 [batch, sequence],
    ``attention_mask`` int64 [batch, total], optional ``position_ids`` int64 [batch, sequence],
    ``past_key_values.N.key`` / ``.value`` float32 [batch, kv_heads, past, head_dim] for N = 0 ..
    L-1; outputs ``logits`` float32 [batch, sequence, vocab] and ``present.N.key`` / ``.value``.

    Raises:
        UserError: any other layout, one line naming ``name`` and what is missing or extra
            (e.g. a model without a KV cache, fused ``present`` tensors, another cache dtype).
    """
    meta = {p.key: p.value for p in model.metadata_props}
    inputs = {v.name: v for v in model.graph.input}
    outputs = {v.name: v for v in model.graph.output}
    past: Dict[int, set] = {}
    for key in inputs:
        m = _PAST.match(key)
        if m:
            past.setdefault(int(m.group(1)), set()).add(m.group(2))
    present: Dict[int, set] = {}
    for key in outputs:
        m = _PRESENT.match(key)
        if m:
            present.setdefault(int(m.group(1)), set()).add(m.group(2))
    accepted = ("accepted: passctl's static cache (passctl export-decoder) or input_ids + "
                "attention_mask + past_key_values.N.key/value -> logits + present.N.key/value "
                "(Optimum, onnxruntime-genai)")
    if "input_ids" not in inputs or "logits" not in outputs:
        raise UserError(f"{name}: no decoder layout (needs an input 'input_ids' and an output "
                        f"'logits'; has inputs {', '.join(sorted(inputs)) or 'none'}); {accepted}")
    if not past:
        raise UserError(f"{name}: no KV cache (no past_key_values.N.key inputs): a model without "
                        f"a cache cannot generate incrementally; {accepted}")
    layers = sorted(past)
    if layers != list(range(len(layers))) or any(past[i] != {"key", "value"} for i in layers):
        raise UserError(f"{name}: past_key_values.N.key/value inputs are incomplete (layers "
                        f"{layers}); {accepted}")
    if sorted(present) != layers or any(present[i] != {"key", "value"} for i in layers):
        raise UserError(f"{name}: present.N.key/value outputs do not match the "
                        f"{len(layers)} past layers; {accepted}")
    first = inputs["past_key_values.0.key"]
    dims = _dims(first)
    elem = first.type.tensor_type.elem_type
    if len(dims) != 4 or elem != onnx.TensorProto.FLOAT:
        raise UserError(f"{name}: past_key_values.0.key is {onnx.TensorProto.DataType.Name(elem)} "
                        f"{dims}; only float32 [batch, kv_heads, length, head_dim] caches are "
                        f"supported; {accepted}")
    logits = _dims(outputs["logits"])
    vocab = logits[-1] if logits and isinstance(logits[-1], int) else 0
    kv = dims[1] if isinstance(dims[1], int) else 0
    hd = dims[3] if isinstance(dims[3], int) else 0
    if meta.get("passctl.layout") == STATIC_LAYOUT:
        return DecoderLayout(STATIC_LAYOUT, len(layers), kv, hd, vocab,
                             int(meta.get("passctl.max_length", dims[2])))
    extra = sorted(set(inputs) - {"input_ids", "attention_mask", "position_ids"}
                   - {f"past_key_values.{i}.{k}" for i in layers for k in ("key", "value")})
    if "attention_mask" not in inputs or extra:
        raise UserError(f"{name}: decoder inputs {', '.join(extra) or '(no attention_mask)'} are "
                        f"not supported; {accepted}")
    if not kv or not hd:
        raise UserError(f"{name}: past_key_values.0.key has symbolic heads or head size {dims}; "
                        "give a model with fixed kv_heads and head_dim")
    return DecoderLayout(DYNAMIC_LAYOUT, len(layers), kv, hd, vocab)
