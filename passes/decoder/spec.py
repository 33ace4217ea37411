"""The architecture of a decoder-only transformer, read from a transformers config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence

from passctl.ir.errors import UserError

#: ``config.model_type`` values whose layers are exactly: RMSNorm, Q/K/V projections (bias
#: optional), rotary (rotate-half) on Q and K, causal grouped-query attention, O projection,
#: residual, RMSNorm, SiLU-gated MLP, residual; a final RMSNorm and an LM head.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

#: ``rope_type`` values whose rotary frequencies do not depend on the sequence length, so one
#: cos/sin table computed at export is exact at every position (transformers'
#: ``ROPE_INIT_FUNCTIONS``; "dynamic" rescales with the current length, "longrope" switches
#: tables at a length threshold).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class DecoderSpec:
    """Shapes and constants of a Llama-style decoder.

    Attributes:
        model_type: transformers' ``config.model_type`` (one of :data:`SUPPORTED_MODEL_TYPES`).
        num_layers, hidden_size, intermediate_size, vocab_size: the usual sizes.
        num_heads: query heads; ``num_kv_heads`` key/value heads (GQA when fewer; MQA when 1).
        head_dim: size of one head (``config.head_dim``, else ``hidden_size // num_heads``).
        rms_norm_eps: epsilon of every RMSNorm.
        tie_word_embeddings: the LM head reuses the token embedding matrix.
        eos_token_ids: token ids that end generation (from the config / generation config).
        bos_token_id: id prepended by tokenizers that add one (None: none).
        max_position_embeddings: the longest sequence the model was trained for.
        sliding_window: attention window (None: full causal attention).
    """

    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    eos_token_ids: Sequence[int] = field(default_factory=tuple)
    bos_token_id: Optional[int] = None
    max_position_embeddings: int = 2048
    sliding_window: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "DecoderSpec":
        data = dict(data)
        data["eos_token_ids"] = tuple(data.get("eos_token_ids", ()))
        return DecoderSpec(**data)


def _ids(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def spec_from_config(config, generation_config=None, name: str = "model") -> DecoderSpec:
    """The :class:`DecoderSpec` of a transformers ``PretrainedConfig`` (or any object with the
    same attributes).

    Raises:
        UserError: ``name``'s architecture is not a supported decoder (model type, activation,
            rope type that changes with length, partial rotary, Q/K norms), one line naming it.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"{name}: model type '{model_type}' has no decoder layout in passctl; "
                        f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (Llama, Mistral, Qwen2, "
                        "SmolLM2 families)")
    act = getattr(config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UserError(f"{name}: MLP activation '{act}' is not supported (only silu)")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) \
        else "default"
    if rope_type not in STATIC_ROPE_TYPES:
        raise UserError(f"{name}: rope type '{rope_type}' changes with the sequence length; "
                        f"supported: {', '.join(STATIC_ROPE_TYPES)}")
    if float(getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise UserError(f"{name}: partial rotary embeddings are not supported")
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if heads % kv_heads:
        raise UserError(f"{name}: {heads} query heads are not a multiple of {kv_heads} key/value "
                        "heads")
    eos = _ids(getattr(generation_config, "eos_token_id", None)) or _ids(config.eos_token_id)
    window = getattr(config, "sliding_window", None)
    if window is not None and not getattr(config, "use_sliding_window", model_type == "mistral"):
        window = None
    bos = getattr(config, "bos_token_id", None)
    return DecoderSpec(
        model_type=model_type, num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size), intermediate_size=int(config.intermediate_size),
        vocab_size=int(config.vocab_size), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=float(config.rms_norm_eps),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        eos_token_ids=eos, bos_token_id=None if bos is None else int(bos),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 2048) or 2048),
        sliding_window=None if window is None else int(window))


def check_max_length(spec: DecoderSpec, max_length: int) -> None:
    """Refuse a cache length the model cannot use.

    Raises:
        UserError: ``max_length`` < 2, beyond ``max_position_embeddings``, or beyond the
            sliding window (where the window would change the result).
    """
    if max_length < 2:
        raise UserError(f"max length {max_length}: give at least 2 (prompt plus one token)")
    if max_length > spec.max_position_embeddings:
        raise UserError(f"max length {max_length} is beyond the model's "
                        f"max_position_embeddings {spec.max_position_embeddings}")
    if spec.sliding_window is not None and max_length > spec.sliding_window:
        raise UserError(f"max length {max_length} is beyond the model's sliding window "
                        f"{spec.sliding_window} (windowed attention is not supported); give "
                        f"--max-length {spec.sliding_window} or less")


#: The ``layout`` of the CUDA decoder artifact (``export-decoder --target h200``): transformers'
#: float weights in ``model.safetensors``, run by the Triton decode step on a CUDA GPU
#: (``passctl.targets.tvm.cuda_generate``; docs/generate.md, "On a GPU: the CUDA artifact").
CUDA_LAYOUT = "passctl-cuda-triton"

#: The model types the CUDA decode step runs: no projection biases (Qwen2's Q/K/V biases are not
#: in its GEMV kernels).
CUDA_MODEL_TYPES = ("llama", "mistral")


def check_cuda_decoder(spec: DecoderSpec, config, max_length: int, name: str = "model") -> None:
    """Refuse what the CUDA decode step (``targets/tvm/triton_decoder.py``) cannot run.

    Raises:
        UserError: a model type with projection biases (Qwen2), ``attention_bias`` /
            ``mlp_bias``, a head size that is not a power of two, or ``max_length`` not a
            multiple of 16 (the decode attention splits the cache in power-of-two chunks); one
            line naming what to change.
    """
    if spec.model_type not in CUDA_MODEL_TYPES or getattr(config, "attention_bias", False) \
            or getattr(config, "mlp_bias", False):
        raise UserError(f"{name}: the CUDA decoder runs {', '.join(CUDA_MODEL_TYPES)} models "
                        f"without projection biases ('{spec.model_type}'"
                        f"{' with biases' if spec.model_type in CUDA_MODEL_TYPES else ''} is not); "
                        "export it for --target cpu")
    if spec.head_dim & (spec.head_dim - 1):
        raise UserError(f"{name}: head size {spec.head_dim} is not a power of two (the CUDA "
                        "decode attention needs one); export it for --target cpu")
    check_max_length(spec, max_length)
    if max_length % 16:
        raise UserError(f"--max-length {max_length}: the CUDA decoder needs a multiple of 16 "
                        f"(e.g. {max_length + 16 - max_length % 16})")
