"""Small float32 graphs for the amp tests (decomposed LayerNorm, float32-min mask) and the amp runner."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser

from passctl.ir import from_onnx, to_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline

F32_MIN = float(np.finfo(np.float32).min)


def run_amp(proto: onnx.ModelProto, pipeline: str, target: str = "cpu"):
    """Run ``pipeline`` (verified after each pass) on a copy of ``proto``; (the result, amp's stats)."""
    model = from_onnx(proto)
    result = PassManager(build_pipeline(pipeline, target), verify_each=True).run(model)
    return to_onnx(model), next(r.stats for r in result.records if r.name == "mixed-precision")


def elem_types(proto: onnx.ModelProto, strict: bool = False) -> dict:
    """Value name -> ONNX element type (``TensorProto.FLOAT16``...) of every value of ``proto``'s main
    graph: ONNX shape inference's (``strict``: it raises on an error) and the initializers'."""
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=strict)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    types.update({i.name: i.data_type for i in proto.graph.initializer})
    return types


def _with_initializers(text: str, arrays: dict) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    for name, arr in arrays.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
    onnx.checker.check_model(model)
    return model


def layernorm_model(hidden: int = 64, seed: int = 0) -> onnx.ModelProto:
    """``y = MatMul(LayerNorm(x), w)`` with the LayerNorm decomposed as torch's exporters write it
    (ReduceMean, Sub, Pow 2, ReduceMean, Add epsilon, Sqrt, Div, Mul gamma, Add beta); x: [2, hidden]."""
    rng = np.random.default_rng(seed)
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    ln (float[2,{hidden}] x) => (float[2,{hidden}] y)
    {{
      mean = ReduceMean <axes=[-1]> (x)
      d = Sub(x, mean)
      sq = Pow(d, two)
      var = ReduceMean <axes=[-1]> (sq)
      ve = Add(var, eps)
      sd = Sqrt(ve)
      n = Div(d, sd)
      s = Mul(n, gamma)
      t = Add(s, beta)
      y = MatMul(t, w)
    }}
    """
    return _with_initializers(text, {
        "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32),
        "gamma": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "beta": (0.1 * rng.standard_normal(hidden)).astype(np.float32),
        "w": (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)})


def masked_attention_model(seq: int = 8, dim: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Single-head attention with the BERT-style additive mask ``(1 - mask) * float32_min``.

    Inputs: ``x`` float32 [seq, dim], ``mask`` int64 [seq] (1 = attend). Output ``y`` float32 [seq, dim].
    """
    rng = np.random.default_rng(seed)
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    attn (float[{seq},{dim}] x, int64[{seq}] mask) => (float[{seq},{dim}] y)
    {{
      q = MatMul(x, wq)
      k = MatMul(x, wk)
      v = MatMul(x, wv)
      kt = Transpose <perm=[1,0]> (k)
      s = MatMul(q, kt)
      scaled = Mul(s, scale)
      m = Cast <to=1> (mask)
      inv = Sub(one, m)
      bias = Mul(inv, fmin)
      masked = Add(scaled, bias)
      p = Softmax <axis=-1> (masked)
      y = MatMul(p, v)
    }}
    """
    w = lambda: (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)  # noqa: E731
    return _with_initializers(text, {
        "wq": w(), "wk": w(), "wv": w(), "scale": np.array(1 / np.sqrt(dim), np.float32),
        "one": np.array(1.0, np.float32), "fmin": np.array(F32_MIN, np.float32)})


def cancellation_model() -> onnx.ModelProto:
    """``y = Mul(Sub(Add(x, 1000), 1000), 2) + x``: the Add and Sub lose x's low bits in fp16
    (spacing 0.5 near 1000), the other nodes do not; x: [64] in [-1, 1)."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    cancel (float[64] x) => (float[64] y)
    {
      a = Add(x, big)
      b = Sub(a, big)
      c = Mul(b, two)
      y = Add(c, x)
    }
    """
    return _with_initializers(text, {"big": np.array(1000.0, np.float32),
                                     "two": np.array(2.0, np.float32)})
