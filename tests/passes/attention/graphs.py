"""Hand-built ONNX attention graphs (one self-attention layer) in the forms exports write, and wrong ones."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def attention_model(heads: int = 4, kv_heads: Optional[int] = None, head_size: int = 8, seq: int = 6,
                    batch: int = 2, scale: Optional[float] = None, scale_form: str = "div-after",
                    mask: str = "none", k_layout: str = "bhtd", softmax_axis: int = -1,
                    mask_after_softmax: bool = False, causal: bool = False, opset: int = 17,
                    seed: int = 0, triangle_upper: int = 0) -> onnx.ModelProto:
    """One attention layer: ``x [B, S, hidden]`` -> Q, K, V projections, heads split, attention,
    heads merged; output ``y [B, S, heads * head_size]``.

    Args:
        kv_heads: KV heads (grouped-query via Unsqueeze/Expand/Reshape ``repeat_kv``); None = heads.
        scale: the scale constant written into the graph (default 1/sqrt(head_size); for
            ``div-after`` the divisor is 1/scale).
        scale_form: ``div-after`` (Div(QK^T, sqrt d)), ``mul-after``, ``split`` (sqrt on Q and K).
        mask: ``none``, ``add`` (float input ``mask [B, 1, 1, S]`` added), ``bool`` (bool input
            ``keep [B, 1, S, S]`` through Where(keep, s, -inf)).
        k_layout: ``bhtd`` (K^T = Transpose(K_bhtd, 0,1,3,2)), ``bthd`` (K^T = Transpose(K_bthd,
            0,2,3,1): correct), ``bhtd-0231`` (Transpose(K_bhtd, 0,2,3,1): wrong, needs heads == seq).
        softmax_axis: Softmax's axis attribute.
        mask_after_softmax: add the float mask to the probabilities instead of the scores.
        causal: a Trilu lower-triangle keep-mask built from the input's length, through Where.
        triangle_upper: Trilu's ``upper`` (1 gives the anti-causal upper triangle: not causal).
    """
    rng = np.random.default_rng(seed)
    kv_heads = kv_heads or heads
    hidden, kv_hidden = heads * head_size, kv_heads * head_size
    scale = 1.0 / math.sqrt(head_size) if scale is None else scale
    inits = {"wq": rng.standard_normal((hidden, hidden)) * 0.3,
             "wk": rng.standard_normal((hidden, kv_hidden)) * 0.3,
             "wv": rng.standard_normal((hidden, kv_hidden)) * 0.3,
             "split_q": np.array([0, 0, heads, head_size]), "split_kv": np.array([0, 0, kv_heads, head_size]),
             "merge": np.array([0, 0, hidden]), "zero": np.array(0.0), "neg_inf": np.array(-np.inf)}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q3"]), helper.make_node("MatMul", ["x", "wk"], ["k3"]),
             helper.make_node("MatMul", ["x", "wv"], ["v3"]),
             helper.make_node("Reshape", ["q3", "split_q"], ["q4"]),
             helper.make_node("Reshape", ["k3", "split_kv"], ["k4"]),
             helper.make_node("Reshape", ["v3", "split_kv"], ["v4"]),
             helper.make_node("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["v4"], ["v_kv"], perm=[0, 2, 1, 3])]
    k_src = "k4"
    if k_layout in ("bhtd", "bhtd-0231"):
        nodes.append(helper.make_node("Transpose", ["k4"], ["k_kv"], perm=[0, 2, 1, 3]))
        k_src = "k_kv"
    if kv_heads != heads:
        rep = heads // kv_heads
        inits.update({"ax2": np.array([2]), "rep": np.array([1, 1, rep, 1, 1]),
                      "heads_shape": np.array([0, heads, -1, head_size])})
        for name in (k_src, "v_kv"):
            nodes += [helper.make_node("Unsqueeze", [name, "ax2"], [name + "_u"]),
                      helper.make_node("Expand", [name + "_u", "rep"], [name + "_e"]),
                      helper.make_node("Reshape", [name + "_e", "heads_shape"], [name + "_r"])]
        k_src, v = k_src + "_r", "v_kv_r"
    else:
        v = "v_kv"
    perm = {"bhtd": [0, 1, 3, 2], "bthd": [0, 2, 3, 1], "bhtd-0231": [0, 2, 3, 1]}[k_layout]
    nodes.append(helper.make_node("Transpose", [k_src], ["kt"], perm=perm))
    if scale_form == "split":
        inits["s"] = np.array(math.sqrt(scale))
        nodes += [helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Mul", ["kt", "s"], ["kts"]),
                  helper.make_node("MatMul", ["qs", "kts"], ["scores"])]
    else:
        inits["s"] = np.array(1.0 / scale if scale_form == "div-after" else scale)
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["qk"]),
                  helper.make_node("Div" if scale_form == "div-after" else "Mul", ["qk", "s"], ["scores"])]
    s = "scores"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", hidden])]
    if mask == "add" and not mask_after_softmax:
        nodes.append(helper.make_node("Add", [s, "mask"], ["masked"]))
        s = "masked"
    if mask in ("add",):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, 1, "sequence"]))
    keep = None
    if mask == "bool":
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL,
                                                    ["batch", 1, "sequence", "sequence"]))
        keep = "keep"
    if causal:  # a Trilu lower triangle, And-ed with the padding mask as transformers does
        inits["one"], inits["two"] = np.array([1]), np.array([2])
        nodes += [helper.make_node("Shape", ["x"], ["xshape"]),
                  helper.make_node("Slice", ["xshape", "one", "two"], ["slen"]),
                  helper.make_node("Concat", ["slen", "slen"], ["ss"], axis=0),
                  helper.make_node("ConstantOfShape", ["ss"], ["ones"],
                                   value=numpy_helper.from_array(np.ones(1, dtype=np.bool_))),
                  helper.make_node("Trilu", ["ones"], ["tril"], upper=triangle_upper)]
        if keep is not None:
            nodes.append(helper.make_node("And", [keep, "tril"], ["keep_causal"]))
        keep = "keep_causal" if keep is not None else "tril"
    if keep is not None:
        nodes.append(helper.make_node("Where", [keep, s, "neg_inf"], ["masked"]))
        s = "masked"
    nodes.append(helper.make_node("Softmax", [s], ["probs"], axis=softmax_axis))
    p = "probs"
    if mask_after_softmax:
        nodes.append(helper.make_node("Add", [p, "mask"], ["probs_m"]))
        p = "probs_m"
    nodes += [helper.make_node("MatMul", [p, v], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merge"], ["y"])]
    init_protos = []
    for name, arr in inits.items():
        arr = np.asarray(arr)
        arr = arr.astype(np.int64) if arr.dtype.kind == "i" else arr.astype(np.float32)
        init_protos.append(numpy_helper.from_array(arr, name))
    graph = helper.make_graph(nodes, "attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             ["batch", "sequence", hidden])],
                              init_protos)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    onnx.checker.check_model(model)
    return model


def feeds(model: onnx.ModelProto, batch: int = 2, seq: int = 6, seed: int = 1):
    """Inputs for :func:`attention_model`: random x; masks with the last 2 keys of batch 1 dropped."""
    rng = np.random.default_rng(seed)
    hidden = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    out = {"x": rng.standard_normal((batch, seq, hidden)).astype(np.float32)}
    names = {i.name for i in model.graph.input}
    if "mask" in names:
        m = np.zeros((batch, 1, 1, seq), np.float32)
        m[1, ..., -2:] = -1e9
        out["mask"] = m
    if "keep" in names:
        k = np.ones((batch, 1, seq, seq), bool)
        k[1, ..., -2:] = False
        out["keep"] = k
    return out


def fp16_cast_attention(heads: int = 2, seq: int = 5, head_size: int = 8) -> onnx.ModelProto:
    """fp16 q, k, v ``[1, H, S, D]`` inputs; scores cast to float32 around Softmax and back (the
    ``softmax(dtype=float32).to(float16)`` of half-precision models)."""
    shape = [1, heads, seq, head_size]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, shape) for n in "qkv"]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "s"], ["scores"]),
             helper.make_node("Cast", ["scores"], ["s32"], to=TensorProto.FLOAT),
             helper.make_node("Softmax", ["s32"], ["p32"], axis=-1),
             helper.make_node("Cast", ["p32"], ["p"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "attention_fp16", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)],
                              [numpy_helper.from_array(np.array(head_size ** -0.5, np.float16), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
