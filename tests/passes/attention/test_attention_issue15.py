"""Issue 15, attention family: the lowerings check the kernels' constraints before choosing them (and
say why they passed one over), Where masks keep their semantics in fully masked rows, K and V are
taken at the same repeat_kv level, Q scaled before the head split fuses, and `fuse` before
`flash-attn` still fuses attention. Every artifact is run in ONNX Runtime against the original."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphs import attention_model  # noqa: E402
from graphs import feeds as layer_feeds  # noqa: E402

from passctl.ir import Node, Value, from_onnx, to_onnx  # noqa: E402
from passctl.passes.manager import PassManager  # noqa: E402
from passctl.passes.pipeline_text import build_pipeline  # noqa: E402
from passctl.support.check import compare, run_onnxruntime  # noqa: E402

CASES = Path(__file__).resolve().parents[2] / "cases"
RTOL = 1e-5


def run(proto: onnx.ModelProto, pipeline: str, target=None) -> Tuple[Dict[str, dict], onnx.ModelProto]:
    model = from_onnx(proto)
    result = PassManager(build_pipeline(pipeline, target)).run(model)
    return {r.name: dict(r.stats) for r in result.records}, to_onnx(model)


def ops(proto: onnx.ModelProto) -> List[str]:
    return [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in proto.graph.node]


def random_feeds(proto: onnx.ModelProto, seed: int = 0, masked_row: bool = True) -> Dict[str, np.ndarray]:
    """Seeded inputs for every graph input (static shapes); a bool input gets its first query row
    (axis -2, or the whole tensor when rank < 2) fully False."""
    rng = np.random.default_rng(seed)
    out = {}
    inits = {i.name for i in proto.graph.initializer}
    for i in proto.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type == TensorProto.BOOL:
            keep = np.array(rng.random(shape) > 0.3)
            if masked_row:
                if len(shape) >= 2:
                    keep[..., 0, :] = False
                else:
                    keep[...] = False
            out[i.name] = keep
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def assert_same(original: onnx.ModelProto, candidate: onnx.ModelProto, inputs) -> Dict[str, np.ndarray]:
    ref = run_onnxruntime(original, inputs)
    got = run_onnxruntime(candidate, inputs)
    result = compare(ref, got)
    assert result.ok(RTOL), result.failures(RTOL)
    return ref


def fallbacks(stats: Dict[str, dict], lowering: str = "lower-onnxruntime") -> str:
    return "\n".join(stats[lowering].get("fallbacks", []))


# -- the case models of ../shared/cases (copied to tests/cases) ---------------------------------------

# file -> (form chosen by lower-onnxruntime, a phrase of the reason a kernel form was passed over)
CASE_MODELS = {
    "01-mha-finite-fill-mask-rank8/model.onnx": ("MultiHeadAttention", None),
    "02-where-fill-masked-row/model.onnx": ("decomposed", "V's head size 4 differs from Q's 8"),
    "03-mha-mask-key-axis-1/model.onnx": ("MultiHeadAttention", None),
    "10-gqa-head-size/model.onnx": ("MultiHeadAttention (kv repeated)",
                                    "head size 4 is not a multiple of 8"),
    "10-gqa-head-size/model_d8.onnx": ("GroupQueryAttention", None),
    "12-gqa-repeat-kv-mismatch/model_kt_repeat.onnx": ("MultiHeadAttention (kv repeated)", None),
}


@pytest.mark.parametrize("pipeline", ["flash-attn", "cleanup,fuse,flash-attn"])
@pytest.mark.parametrize("name", list(CASE_MODELS))
def test_case_model_runs_and_matches(name, pipeline):
    proto = onnx.load(str(CASES / name))
    form, reason = CASE_MODELS[name]
    stats, out = run(proto, pipeline)
    assert stats["fuse-attention"]["attention"] == 1, stats["fuse-attention"]
    lowered = stats["lower-onnxruntime"]
    assert lowered.get(f"Attention->{'' if form == 'decomposed' else 'com.microsoft::'}{form}") == 1, lowered
    if reason is not None:
        assert reason in fallbacks(stats), lowered
    inputs = (dict(np.load(str(CASES / name).replace("model.onnx", "inputs.npz")))
              if name.startswith("02-") else random_feeds(proto))
    assert_same(proto, out, inputs)
    if name.startswith("01-"):  # every row masked: the original averages V (uniform softmax)
        inputs = {**inputs, "keep44": np.zeros((1, 1, 1, 8), bool)}
        ref = assert_same(proto, out, inputs)
        assert np.isfinite(next(iter(ref.values()))).all()


def test_case_02_fully_masked_row_is_the_mean_of_v():
    proto = onnx.load(str(CASES / "02-where-fill-masked-row/model.onnx"))
    inputs = dict(np.load(str(CASES / "02-where-fill-masked-row/inputs.npz")))
    _, out = run(proto, "flash-attn")
    ref = assert_same(proto, out, inputs)
    keep = next(v for v in inputs.values() if v.dtype == bool)
    assert not keep.any(axis=-1).all(), "the inputs must hold a fully masked row"


def test_case_12_k_and_v_heads_agree():
    proto = onnx.load(str(CASES / "12-gqa-repeat-kv-mismatch/model_kt_repeat.onnx"))
    model = from_onnx(proto)
    PassManager(build_pipeline("infer-shapes,fuse-attention")).run(model)
    (node,) = [n for n in model.graph if n.op_type == "Attention"]
    assert node.attr("num_heads") == 4 and node.attr("kv_num_heads") == 2  # K^T's repeat followed
    assert [v.shape.dims[1] for v in node.inputs[:3]] == [4, 2, 2]


# -- finite-fill Where masks: fully masked rows stay exact in every lowering ----------------------------

B, H, S, D = 2, 2, 4, 8
MASK_SHAPES = {"[1,1,1,T]": [1, 1, 1, S], "[1,1,S,T]": [1, 1, S, S], "[B,H,S,T]": [B, H, S, S],
               "[S,T]": [S, S], "[T]": [S], "[S,1]": [S, 1], "scalar": []}


def where_attention(mask_shape, fill: float, opset: int = 17, form: str = "where",
                    mask_dtype=TensorProto.BOOL, softmax_axis: int = -1) -> onnx.ModelProto:
    """q, k, v ``[B, H, S, D]`` inputs; ``softmax(mask(q . k^T / sqrt(D))) . v`` with the mask an
    input of ``mask_shape``: ``Where(keep, s, fill)`` (form ``where``) or ``s + mask`` (``add``)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, H, S, D]) for n in "qkv"]
    ins.append(helper.make_tensor_value_info("m", mask_dtype, mask_shape))
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Div", ["qk", "sqrt_d"], ["s"])]
    if form == "where":
        nodes.append(helper.make_node("Where", ["m", "s", "fill"], ["masked"]))
    else:
        nodes.append(helper.make_node("Add", ["s", "m"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked"], ["p"], axis=softmax_axis),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = [numpy_helper.from_array(np.array(math.sqrt(D), np.float32), "sqrt_d"),
             numpy_helper.from_array(np.array(fill, np.float32), "fill")]
    graph = helper.make_graph(nodes, "where_attention", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, H, S, D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    onnx.checker.check_model(model)
    return model


FILLS = {"-1e4": -1e4, "-1e5": -1e5, "-1e9": -1e9, "finfo.min": float(np.finfo(np.float32).min)}
LOWERINGS = {"ort-17": (17, "flash-attn", None), "standard-17": (17, "flash-attn", "tensorrt"),
             "ort-23": (23, "flash-attn", None)}


@pytest.mark.parametrize("lowering", list(LOWERINGS))
@pytest.mark.parametrize("fill", list(FILLS))
@pytest.mark.parametrize("shape", list(MASK_SHAPES))
def test_finite_fill_where_is_exact_in_fully_masked_rows(shape, fill, lowering):
    opset, pipeline, target = LOWERINGS[lowering]
    proto = where_attention(MASK_SHAPES[shape], FILLS[fill], opset)
    model = from_onnx(proto)
    PassManager(build_pipeline("infer-shapes,fuse-attention")).run(model)
    (node,) = [n for n in model.graph if n.op_type == "Attention"]
    assert node.attr("mask_kind") == "boolean" and node.attr("mask_fill") == pytest.approx(FILLS[fill])
    _, out = run(proto, pipeline, target)
    assert "Softmax" not in ops(out) or target == "tensorrt" and opset < 23, ops(out)
    for seed in (0, 1):
        inputs = random_feeds(proto, seed)
        ref = assert_same(proto, out, inputs)
        # independent check: a fully masked row of the original is the mean of V over the keys
        keep = np.broadcast_to(inputs["m"], (B, H, S, S))
        rows = ~keep.any(axis=-1)
        assert rows.any()
        mean_v = np.broadcast_to(inputs["v"].mean(axis=2, keepdims=True), (B, H, S, D))
        np.testing.assert_allclose(ref["y"][rows], mean_v[rows], rtol=1e-5, atol=1e-6)


def test_finite_fill_where_on_tvm(tmp_path):
    from passctl.support.profiles import get_target
    from passctl.targets.tvm import TvmEmitter, load_artifact

    proto = where_attention([S, S], -1e4)
    model = from_onnx(proto)
    PassManager(build_pipeline("flash-attn", "cpu", "tvm")).run(model)
    assert any(n.op_type == "Attention" for n in model.graph)
    folder = tmp_path / "tvm"
    folder.mkdir()
    TvmEmitter(schedule=False, self_check=False).write(model, get_target("cpu"), str(folder))
    inputs = random_feeds(proto)
    result = compare(run_onnxruntime(proto, inputs), load_artifact(str(folder)).run(inputs))
    assert result.ok(1e-4), result.failures(1e-4)


# -- attention_bias of every broadcast shape: rank 4, last axis T, query axis S ------------------------

BROADCAST_MASKS = {"[S,1]": [S, 1], "[B,1,S,1]": [B, 1, S, 1], "[1,H,S,1]": [1, H, S, 1],
                   "[1,H,1,1]": [1, H, 1, 1], "[1]": [1], "scalar": [], "[T]": [S], "[B,1,1,T]": [B, 1, 1, S]}


@pytest.mark.parametrize("opset", [17, 23])
@pytest.mark.parametrize("form", ["add", "where-inf", "where-finite"])
@pytest.mark.parametrize("shape", list(BROADCAST_MASKS))
def test_mask_broadcast_becomes_a_rank4_attention_bias(shape, form, opset):
    if form == "add":
        proto = where_attention(BROADCAST_MASKS[shape], 0.0, opset, form="add", mask_dtype=TensorProto.FLOAT)
    else:
        proto = where_attention(BROADCAST_MASKS[shape], -np.inf if form == "where-inf" else -1e5, opset)
    stats, out = run(proto, "flash-attn")
    kernel = "MultiHeadAttention" if opset < 23 else "Attention"
    form_name = "com.microsoft::MultiHeadAttention" if opset < 23 else "Attention-23"
    assert stats["lower-onnxruntime"].get(f"Attention->{form_name}") == 1, stats
    (node,) = [n for n in out.graph.node if n.op_type == kernel]
    assert len(node.input) == (6 if opset < 23 else 4)  # attention_bias / attn_mask given
    inputs = random_feeds(proto, masked_row=form == "where-finite")
    if form == "where-inf":
        inputs["m"] = np.ones_like(inputs["m"])  # -inf rows would be NaN in the original
        inputs["m"].reshape(-1)[-1] = inputs["m"].size == 1  # one masked entry unless a scalar
    assert_same(proto, out, inputs)


def test_unknown_mask_rank_is_not_guessed():
    """A mask value without a shape: the kernel forms refuse (no 8-D bias), the report says why, and
    the decomposed form runs."""
    proto = where_attention([1, 1, S, S], -1e4)
    model = from_onnx(proto)
    PassManager(build_pipeline("infer-shapes,fuse-attention")).run(model)
    (node,) = [n for n in model.graph if n.op_type == "Attention"]
    untyped = Value("m_untyped")  # what a rewrite that forgets the shape leaves
    model.graph.insert_before(node, Node("", "Identity", [node.inputs[3]], outputs=[untyped]))
    node.set_input(3, untyped)
    result = PassManager(build_pipeline("lower-onnxruntime,dce")).run(model)
    stats = result.records[0].stats
    assert stats.get("Attention->decomposed") == 1, stats
    assert "the rank of mask 'm_untyped' is unknown" in "\n".join(stats["fallbacks"]), stats
    assert_same(proto, to_onnx(model), random_feeds(proto))


# -- GQA: head size, repeat_kv written several ways ----------------------------------------------------

@pytest.mark.parametrize("head_size,kernel", [
    (4, "MultiHeadAttention (kv repeated)"), (12, "MultiHeadAttention (kv repeated)"),
    (8, "GroupQueryAttention"), (16, "GroupQueryAttention")])
def test_gqa_head_size_rule(head_size, kernel):
    proto = attention_model(kv_heads=2, causal=True, head_size=head_size)
    stats, out = run(proto, "flash-attn")
    assert stats["lower-onnxruntime"].get(f"Attention->com.microsoft::{kernel}") == 1, stats
    if head_size % 8:
        assert f"head size {head_size} is not a multiple of 8" in fallbacks(stats)
    assert_same(proto, out, layer_feeds(proto))


def repeat_kv_model(k_form: str, v_form: str, fill: Optional[float] = None) -> onnx.ModelProto:
    """4 query heads, 2 KV heads ``[1, 2, 5, 8]`` inputs; K and V repeated to 4 heads each in its
    own way: ``repeat`` (Unsqueeze(2) / Expand / Reshape of [B, Hkv, T, D]), ``kt-repeat`` (K only:
    transposed to [B, Hkv, D, T] first, then repeated), ``tile`` (Tile(x, [1, 2, 1, 1]): head h
    reads KV head h % 2), ``concat`` (Concat(x, x) on the head axis, the same as tile). With
    ``fill``, the scores pass through ``Where(keep, s, fill)`` with a bool input ``keep [5, 5]``."""
    hq, hkv, t, d = 4, 2, 5, 8
    ins = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, hq, t, d]),
           helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, hkv, t, d]),
           helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, hkv, t, d])]
    inits = {"ax2": np.array([2]), "rep": np.array([1, 1, 2, 1, 1]), "bhtd": np.array([0, hq, -1, d]),
             "bhdt": np.array([0, hq, d, -1]), "tiles": np.array([1, 2, 1, 1]),
             "s": np.array(1 / math.sqrt(d), np.float32)}
    nodes = []

    def rep(x, form, shape_name):
        if form in ("repeat", "kt-repeat"):
            nodes.extend([helper.make_node("Unsqueeze", [x, "ax2"], [x + "_u"]),
                          helper.make_node("Expand", [x + "_u", "rep"], [x + "_e"]),
                          helper.make_node("Reshape", [x + "_e", shape_name], [x + "_r"])])
        elif form == "tile":
            nodes.append(helper.make_node("Tile", [x, "tiles"], [x + "_r"]))
        else:
            nodes.append(helper.make_node("Concat", [x, x], [x + "_r"], axis=1))
        return x + "_r"

    if k_form == "kt-repeat":
        nodes.append(helper.make_node("Transpose", ["k"], ["kt0"], perm=[0, 1, 3, 2]))
        kt = rep("kt0", k_form, "bhdt")
    else:
        nodes.append(helper.make_node("Transpose", [rep("k", k_form, "bhtd")], ["kt"], perm=[0, 1, 3, 2]))
        kt = "kt"
    v = rep("v", v_form, "bhtd")
    nodes += [helper.make_node("MatMul", ["q", kt], ["qk"]), helper.make_node("Mul", ["qk", "s"], ["sc"])]
    if fill is not None:
        ins.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [t, t]))
        inits["fill"] = np.array(fill, np.float32)
        nodes.append(helper.make_node("Where", ["keep", "sc", "fill"], ["scm"]))
    nodes += [helper.make_node("Softmax", ["scm" if fill is not None else "sc"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", v], ["y"])]
    init_protos = [numpy_helper.from_array(a if a.dtype == np.float32 else a.astype(np.int64), n)
                   for n, a in inits.items()]
    graph = helper.make_graph(nodes, "repeat_kv", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, hq, t, d])],
                              init_protos)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("k_form,v_form,kv_heads", [
    ("repeat", "repeat", 2), ("kt-repeat", "repeat", 2), ("repeat", "tile", 4), ("tile", "repeat", 4),
    ("kt-repeat", "concat", 4), ("tile", "tile", 4)])
def test_repeat_kv_forms_k_and_v_alike(k_form, v_form, kv_heads):
    proto = repeat_kv_model(k_form, v_form)
    model = from_onnx(proto)
    PassManager(build_pipeline("infer-shapes,fuse-attention")).run(model)
    (node,) = [n for n in model.graph if n.op_type == "Attention"]
    assert (node.attr("num_heads"), node.attr("kv_num_heads")) == (4, kv_heads)
    assert node.inputs[1].shape.dims[1] == node.inputs[2].shape.dims[1] == kv_heads
    for pipeline, target in (("flash-attn", None), ("flash-attn", "tensorrt")):
        _, out = run(proto, pipeline, target)
        assert_same(proto, out, random_feeds(proto))


# -- item 8: Q scaled before the head split; `fuse` before `flash-attn` ---------------------------------

def _bart_attention(dynamo: bool, path: Path, scale_q: bool = True):
    """Whisper's / Marian's self-attention as torch.onnx writes it: ``q_proj(x) * scaling`` on
    ``[B, S, hidden]`` before the view + transpose head split, ``matmul`` with ``k.transpose(-2,
    -1)``, softmax, ``matmul`` with V, heads merged."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self, hidden=32, heads=4):
            super().__init__()
            self.h, self.d = heads, hidden // heads
            self.scaling = self.d ** -0.5
            self.q_proj, self.k_proj = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)
            self.v_proj, self.out = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)

        def _shape(self, x, b, s):
            return x.view(b, s, self.h, self.d).transpose(1, 2)

        def forward(self, x):
            b, s, _ = x.shape
            q = self.q_proj(x) * self.scaling if scale_q else self.q_proj(x)
            q, k = self._shape(q, b, s), self._shape(self.k_proj(x), b, s)
            v = self._shape(self.v_proj(x), b, s)
            p = torch.softmax(torch.matmul(q, k.transpose(-2, -1)), dim=-1)
            y = torch.matmul(p, v).transpose(1, 2).reshape(b, s, self.h * self.d)
            return self.out(y)

    torch.manual_seed(0)
    module = Attention().eval()
    x = torch.randn(2, 6, 32)
    torch.onnx.export(module, (x,), str(path), dynamo=dynamo, input_names=["x"], output_names=["y"],
                      opset_version=17)
    return onnx.load(str(path))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_q_scaled_before_head_split_fuses(dynamo, tmp_path):
    proto = _bart_attention(dynamo, tmp_path / "bart.onnx")
    stats, out = run(proto, "flash-attn")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 1 and fuse["unfused_softmax"] == 0, fuse["unfused"]
    assert "com.microsoft::MultiHeadAttention" in ops(out)
    inputs = {"x": np.random.default_rng(0).standard_normal((2, 6, 32)).astype(np.float32)}
    assert_same(proto, out, inputs)


def test_unscaled_q_is_still_refused_with_the_scale_named(tmp_path):
    proto = _bart_attention(False, tmp_path / "bart.onnx", scale_q=False)
    stats, _ = run(proto, "flash-attn")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 0
    assert "is not 1/sqrt(head size 8)" in fuse["unfused"][0], fuse["unfused"]


FUSE_CASES = {"nomask": dict(mask_shape=[1, 1, 1, S], fill=-np.inf, form="add", mask_dtype=TensorProto.FLOAT),
              "where-inf": dict(mask_shape=[B, 1, S, S], fill=-np.inf),
              "where-finite": dict(mask_shape=[S, S], fill=-1e4)}


@pytest.mark.parametrize("case", list(FUSE_CASES))
def test_fuse_then_flash_attn_fuses_attention(case):
    proto = where_attention(**FUSE_CASES[case])
    _, fused_only = run(proto, "cleanup,fuse")
    assert "com.microsoft::FusedMatMul" in ops(fused_only)  # what flash-attn then finds
    stats, out = run(proto, "cleanup,fuse,flash-attn")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 1 and fuse["fused_matmul_read"] == 1 and fuse["unfused_softmax"] == 0, fuse
    assert "Softmax" not in ops(out) and "com.microsoft::FusedMatMul" not in ops(out), ops(out)
    assert "com.microsoft::MultiHeadAttention" in ops(out)
    inputs = random_feeds(proto, masked_row=case == "where-finite")
    if case == "nomask":
        inputs["m"] = np.zeros_like(inputs["m"])
    assert_same(proto, out, inputs)


@pytest.mark.parametrize("case", [dict(), dict(mask="add", scale_form="mul-after"),
                                  dict(kv_heads=2, causal=True), dict(mask="bool", scale_form="split")])
def test_fuse_then_flash_attn_on_layers(case):
    proto = attention_model(**case)
    stats, out = run(proto, "cleanup,fuse,flash-attn")
    fuse = stats["fuse-attention"]
    assert fuse["attention"] == 1 and fuse["unfused_softmax"] == 0, fuse
    assert "Softmax" not in ops(out) and "com.microsoft::FusedMatMul" not in ops(out), ops(out)
    assert_same(proto, out, layer_feeds(proto))


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
def test_fuse_then_flash_attn_on_exports(dynamo, tmp_path):
    proto = _bart_attention(dynamo, tmp_path / "bart.onnx")
    stats, out = run(proto, "cleanup,fuse,flash-attn")
    assert stats["fuse-attention"]["attention"] == 1, stats["fuse-attention"]
    assert "Softmax" not in ops(out) and "com.microsoft::FusedMatMul" not in ops(out), ops(out)
    inputs = {"x": np.random.default_rng(1).standard_normal((2, 6, 32)).astype(np.float32)}
    assert_same(proto, out, inputs)


def test_fused_matmul_that_is_not_attention_is_put_back():
    """FusedMatMul scores whose Softmax is over the query axis: read as MatMul, refused, put back."""
    proto = where_attention([S, S], -1e4, softmax_axis=2)
    stats, out = run(proto, "cleanup,fuse,flash-attn")
    assert stats["fuse-attention"]["attention"] == 0
    assert stats["fuse-attention"]["fused_matmul_read"] == 0
    assert "normalizes axis 2" in stats["fuse-attention"]["unfused"][0]
    assert "com.microsoft::FusedMatMul" in ops(out) and "MatMul" in ops(out), ops(out)
    assert_same(proto, out, random_feeds(proto))


@pytest.mark.parametrize("opset,form", [(17, "com.microsoft::GroupQueryAttention"), (23, "Attention-23")])
def test_minus_inf_fully_masked_rows_stay_nan(opset, form):
    """A -inf mask that drops every key of a row: the original's softmax is NaN there; the kernels
    that give 0 instead (GroupQueryAttention, Attention-23 on ONNX Runtime's CPU) get the NaN back
    (no nan_to_zero in this model)."""
    proto = attention_model(kv_heads=2, causal=True, mask="bool", opset=opset)
    stats, out = run(proto, "flash-attn")
    assert stats["lower-onnxruntime"].get(f"Attention->{form}") == 1, stats
    inputs = layer_feeds(proto)
    inputs["keep"][1, :, 2, :] = False
    ref = assert_same(proto, out, inputs)
    assert np.isnan(ref["y"][1, 2]).all() and not np.isnan(ref["y"][0]).any()


@pytest.mark.parametrize("lowering", list(LOWERINGS))
def test_grouped_query_finite_fill_fully_masked_rows(lowering):
    """Grouped-query attention (K and V repeat_kv x2) with Where(keep, s, -1e4): the kernels' fix of
    fully masked rows reads V's mean repeated to the query heads."""
    opset, pipeline, target = LOWERINGS[lowering]
    proto = repeat_kv_model("repeat", "repeat", fill=-1e4)
    proto.opset_import[0].version = opset
    proto.ir_version = 10 if opset >= 21 else 8
    stats, out = run(proto, pipeline, target)
    assert stats["fuse-attention"]["grouped_query"] == 1, stats["fuse-attention"]
    for seed in (0, 1):
        assert_same(proto, out, random_feeds(proto, seed))
