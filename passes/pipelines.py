"""Named pass groups (aliases) per target, as plain ordered lists."""

from __future__ import annotations

from typing import Dict, List, Optional

# Every alias of every target. An alias that maps to an empty list exists (so the name is reserved and
# documented) but has no passes yet; using it is a UserError that names what is missing.
DEFAULT_TARGET = "cpu"

CLEANUP: List[str] = [
    # NOTE: infer-shapes first: fold-constants can fold Shape (and Slice/Gather of Shape) only where the
    # input's shape is known, and models often declare none for intermediate values.
    "infer-shapes",
    # NOTE: eliminate-identity next: Identity nodes hide constant inputs from fold-constants and make
    # equal expressions look different to cse.
    "eliminate-identity",
    # NOTE: fold-constants before cse: folding turns subgraphs into initializers, and cse then merges
    # equal ones; the other order would compare expressions that are about to disappear.
    "fold-constants",
    "cse",
    # NOTE: dce last: folding and cse leave dead producers and initializers behind.
    "dce",
]

# The target-independent part of `fuse`: every fusion family, emitting canonical passctl:: ops
# (dialect/canonical.py) or ONNX ops. Extend it here; each target list below appends its lowering.
FUSE_FAMILIES: List[str] = [
    # NOTE: infer-shapes first: the normalization checks need ranks and last dimensions (is the reduced
    # axis the last one? does a scale broadcast to [D]? do x and skip have one shape?), and models
    # often declare no shapes for intermediate values.
    "infer-shapes",
    # NOTE: fuse-conv-bn first among the fusions: a folded BatchNormalization leaves Conv + bias, which
    # later conv + activation fusions expect.
    "fuse-conv-bn",
    # NOTE: fuse-reshape-chains early (H9): collapsed Reshape/Transpose chains and cancelled
    # Squeeze/Unsqueeze pairs put producer and consumer ops next to each other for the later patterns;
    # eliminate-identity removes the Identity nodes it leaves where a chain cancels.
    "fuse-reshape-chains",
    "eliminate-identity",
    # NOTE: the normalization and GELU families run before any MatMul + Add fusion (Gemm /
    # MatMul-with-bias): SkipLayerNorm and BiasGelu absorb the Linear layer's bias Add, which a Gemm
    # fusion would otherwise take first. Conv + activation fusions that match activations in their
    # ONNX form (Sigmoid * x, HardSigmoid...) go before fuse-activations, which turns those into
    # passctl::SiLU / passctl::HardSwish.
    "fuse-layernorm",
    # NOTE: fuse-skip-rmsnorm right after fuse-layernorm: it reads the passctl::RMSNorm that pass
    # makes and takes the residual Add in front of it (the sum stays an output for the next block).
    "fuse-skip-rmsnorm",
    "fuse-gelu",
    "fuse-activations",
    # NOTE: dce after the fusions: rewrites leave the constants they replaced (epsilon, 0.5, sqrt(2)).
    "dce",
]

def _insert_before(names: List[str], anchor: str, extra: List[str]) -> List[str]:
    i = names.index(anchor)
    return names[:i] + extra + names[i:]


# NOTE (H9): fuse-conv-activation emits com.microsoft::FusedConv with the activations of ONNX Runtime's CPU
# kernel; it runs before fuse-activations (which would turn x * HardSigmoid(x) into passctl::HardSwish).
# fuse-gemm runs after the normalization/GELU families (they take the Linear bias Add first) and emits
# Gemm or com.microsoft::FusedMatMul; fuse-gemm-standard emits standard ONNX only.
_FUSE_ORT_FAMILIES: List[str] = _insert_before(
    _insert_before(FUSE_FAMILIES, "fuse-activations", ["fuse-conv-activation"]), "dce", ["fuse-gemm"])
_FUSE_STANDARD_FAMILIES: List[str] = _insert_before(FUSE_FAMILIES, "dce", ["fuse-gemm-standard"])

FUSE_ONNXRUNTIME: List[str] = _FUSE_ORT_FAMILIES + [
    # NOTE: lowering last: every fusion emits canonical passctl:: ops; lower-onnxruntime turns them into
    # ONNX Runtime's contrib ops (com.microsoft) and ONNX ops, so nothing after it may add passctl ops.
    "lower-onnxruntime",
]

FUSE_STANDARD: List[str] = _FUSE_STANDARD_FAMILIES + [
    # NOTE: for emitters that import standard ONNX (TVM, TensorRT): canonical ops become the standard op
    # of the model's opset or its decomposition.
    "lower-standard",
]

REPARAM: List[str] = [
    # NOTE: reparam runs before fuse: it needs the training-time branches (Conv + BN, the identity BN,
    # the branch Adds) as they are; fuse-conv-bn would fold each branch's BN into its Conv first and
    # fusions such as Conv+Add or Conv+Relu would hide the branch sums. reparam-branches also does the
    # single-branch Conv + BN / per-channel Mul-Add folds (the same bn_math code as fuse-conv-bn).
    "reparam-branches",
    # NOTE: dce after: the merged branches leave their weights, BN statistics and Constant nodes
    # unused.
    "dce",
]

AMP: List[str] = [
    # NOTE (H13): infer-shapes first: mixed-precision decides per node from the element types of its
    # inputs and outputs (only float32 nodes with a known op are converted), and exports keep few types
    # for intermediate values.
    "infer-shapes",
    # NOTE: mixed-precision assigns fp16/bf16 per node, measures and searches the float32 set, inserts
    # the Casts, converts each weight once and removes redundant Casts itself.
    "mixed-precision",
    # NOTE: dce last: Constant nodes and shape computations that only fed replaced weights are dead.
    "dce",
]

QUANTIZE: List[str] = [
    # NOTE: infer-shapes first: quantize-int8 quantizes only float32 data inputs, and exports keep
    # few types for intermediate values.
    "infer-shapes",
    # NOTE: quantize-int8 calibrates, measures, searches the float32 set and writes QDQ itself, in
    # the target's form: int8 with zero point 0 on GPUs (TensorRT requires it), uint8 with zero point
    # 128 on the cpu (the same symmetric grid; ONNX Runtime's x86 U8S8 kernels).
    "quantize-int8",
    # NOTE: dce last: the float32 weights (initializers or Constant nodes) it replaced are dead.
    "dce",
]

# NOTE (H9): the GPU profiles run ONNX Runtime's CUDA execution provider, whose FusedConv kernel applies
# only activation="Relu" (contrib_ops/cuda/fused_conv.cc, MapMode): no fuse-conv-activation there.
FUSE_ONNXRUNTIME_GPU: List[str] = [n for n in FUSE_ONNXRUNTIME if n != "fuse-conv-activation"]

# Attention substitution (issue 6): every guarded attention pattern -> passctl::Attention, then the
# target's kernel. ONNX Runtime: Attention-23 from opset 23, else com.microsoft.MultiHeadAttention.
FLASH_ATTN_ONNXRUNTIME: List[str] = [
    # NOTE: infer-shapes first: the attention guard needs ranks, the static head count and head size.
    "infer-shapes",
    # NOTE: eliminate-identity and fold-constants before the fusion: eager attention exported by the
    # legacy exporter keeps no-op Casts around Softmax (softmax(dtype=float32).to(float32)), and its
    # sdpa export computes the scale at run time (1 / Sqrt(Cast(Shape(q)[-1]))), a constant only once
    # folded.
    "eliminate-identity",
    "fold-constants",
    "fuse-attention",
    "lower-onnxruntime",
    # NOTE: dce last: the rewrite leaves the K^T transposes, repeat_kv expansions and head-split
    # reshapes it looked through, and MultiHeadAttention takes the 3-D projections directly.
    "dce",
]

FLASH_ATTN_TVM: List[str] = [
    "infer-shapes",
    "eliminate-identity",
    "fold-constants",
    # NOTE: no lowering: the TVM emitter translates passctl::Attention to Relax's nn.attention
    # (targets/tvm/relax_attention.py), which TVM offloads to flash-style kernels on CUDA.
    "fuse-attention",
    "dce",
]

FLASH_ATTN_STANDARD: List[str] = [
    "infer-shapes",
    "eliminate-identity",
    "fold-constants",
    "fuse-attention",
    # NOTE: lower-standard gives ONNX Attention-23 (TensorRT's parser maps it to its fused attention)
    # when the model's opset is >= 23, else the decomposed form (no kernel to substitute).
    "lower-standard",
    "dce",
]

# alias -> target -> ordered pass names. A target missing here uses DEFAULT_TARGET's list.
ALIASES: Dict[str, Dict[str, List[str]]] = {
    "cleanup": {DEFAULT_TARGET: CLEANUP},
    "fuse": {DEFAULT_TARGET: FUSE_ONNXRUNTIME, "tvm": FUSE_STANDARD, "tensorrt": FUSE_STANDARD,
             **{gpu: FUSE_ONNXRUNTIME_GPU for gpu in ("a10", "t4", "l4", "a100", "h100", "h200")}},
    "reparam": {DEFAULT_TARGET: REPARAM},
    "amp": {DEFAULT_TARGET: AMP},
    "flash-attn": {DEFAULT_TARGET: FLASH_ATTN_ONNXRUNTIME, "tvm": FLASH_ATTN_TVM,
                   "tensorrt": FLASH_ATTN_STANDARD},
    "quantize": {DEFAULT_TARGET: QUANTIZE},
}

# Why an alias without passes fails: the feature that will bring them.
NOT_YET: Dict[str, str] = {}  # every alias has its passes in this version


def alias_passes(alias: str, target: Optional[str] = None,
                 emitter: Optional[str] = None) -> Optional[List[str]]:
    """The ordered pass names of ``alias`` for ``target`` (``None`` when ``alias`` is not an alias).

    The list is looked up by the emitter first (``"tvm"``, ``"tensorrt"``: their legalization differs
    from ONNX Runtime's whatever the GPU), then by the target profile, then :data:`DEFAULT_TARGET`.

    Args:
        alias: A group name such as ``"cleanup"``.
        target: A target profile name (``"cpu"``, ``"a10"``...); ``None`` means :data:`DEFAULT_TARGET`.
        emitter: The emitter the pipeline feeds (``"onnxruntime"``, ``"tvm"``, ``"tensorrt"``) or None.

    Returns:
        A new list (possibly empty for a reserved alias), or ``None`` for a name that is not an alias.
    """
    per_target = ALIASES.get(alias)
    if per_target is None:
        return None
    if emitter is not None and emitter in per_target:
        return list(per_target[emitter])
    names = per_target.get(target or DEFAULT_TARGET, per_target.get(DEFAULT_TARGET, []))
    return list(names)
