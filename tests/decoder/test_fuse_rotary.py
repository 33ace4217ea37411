"""fuse-rotary on graphs the torch dynamo exporter writes: tiny Llama decoders with a KV cache
(rotate-half; GQA and MQA), a GPT-J style interleaved rotary module, and near misses left alone.
Every reference is computed independently: ONNX Runtime on the original graph, torch eager, numpy."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch

from decoder_helpers import past_decoder_feeds
from passctl.ir import load
from passctl.ir.onnx_export import to_onnx
from passctl.passes.registry import get_pass
from passctl.support.check import run_onnxruntime


def _rel(got, ref) -> float:
    return float(np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-30))


def _rewrite(path, pipeline, **options):
    """The model at ``path`` after ``pipeline`` (pass names); the statistics of each pass."""
    model = load(str(path))
    stats = {}
    for name in pipeline:
        p = get_pass(name)(**options.get(name, {}))
        stats[name] = p.run(model).stats
    return model, stats


def _ops(model):
    return [(n.domain, n.op_type) for n in to_onnx(model).graph.node]


PIPE = ["infer-shapes", "fuse-rotary", "dce"]


@pytest.mark.parametrize("lower", ["lower-onnxruntime", "lower-standard"])
def test_llama_rotary_fuses_per_q_and_k_and_keeps_logits_and_presents(past_decoder, lower):
    """One RotaryEmbedding per Q and K of each layer; the lowered graph (com.microsoft kernel, or
    standard ops at opset 18) gives ONNX Runtime's logits and presents of the original within
    1e-5 relative, for a prefill of 5 tokens (empty past), a decode step on a past of 6 and a
    chunk of 3 on a past of 4 with batch 2."""
    model, path = past_decoder
    rewritten, stats = _rewrite(path, PIPE + [lower])
    assert stats["fuse-rotary"]["rotate-half"] == 2 * model.config.num_hidden_layers
    assert "unfused" not in stats["fuse-rotary"]
    nodes = to_onnx(rewritten).graph.node
    if lower == "lower-onnxruntime":
        assert sum(n.op_type == "RotaryEmbedding" and n.domain == "com.microsoft" for n in nodes) == 4
    else:  # the decomposed form gathers cos and sin rows per rotary
        assert sum(n.op_type == "Gather" and n.input[0].startswith("rotary_") for n in nodes) == 8
    assert not any(op[0] == "passctl" for op in _ops(rewritten))
    assert not any(op[1] in ("Cos", "Sin", "Neg") for op in _ops(rewritten))
    proto = to_onnx(rewritten)
    for batch, past, seq in ((1, 0, 5), (1, 6, 1), (2, 4, 3)):
        feeds = past_decoder_feeds(model, batch, past, seq, seed=past)
        ref = run_onnxruntime(path, feeds)
        got = run_onnxruntime(proto, feeds)
        assert set(got) == set(ref)
        for name in ref:
            assert _rel(got[name], ref[name]) < 1e-5, (name, batch, past, seq)


def test_rewritten_llama_matches_transformers_eager(past_decoder):
    """The same rewritten graph against torch eager on a prefill of 4 then one decode step with
    transformers' own cache (not ONNX Runtime on the original)."""
    model, path = past_decoder
    rewritten, _ = _rewrite(path, PIPE + ["lower-onnxruntime"])
    proto = to_onnx(rewritten)
    ids = np.array([[5, 17, 42, 8, 99]], np.int64)
    kv = model.config.num_key_value_heads
    hd = model.config.hidden_size // model.config.num_attention_heads
    feeds = {"input_ids": ids[:, :4], "attention_mask": np.ones((1, 4), np.int64),
             "position_ids": np.arange(4, dtype=np.int64)[None]}
    feeds.update({f"past_key_values.{i}.{k}": np.zeros((1, kv, 0, hd), np.float32)
                  for i in range(2) for k in ("key", "value")})
    first = run_onnxruntime(proto, feeds)
    step = {"input_ids": ids[:, 4:], "attention_mask": np.ones((1, 5), np.int64),
            "position_ids": np.array([[4]], np.int64)}
    step.update({f"past_key_values.{i}.{k}": first[f"present.{i}.{k}"] for i in range(2)
                 for k in ("key", "value")})
    second = run_onnxruntime(proto, step)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids)).logits.numpy()
    assert _rel(first["logits"], ref[:, :4]) < 1e-5
    assert _rel(second["logits"], ref[:, 4:]) < 1e-5


# -- a GPT-J style interleaved rotary and near misses, as small torch modules --------------------
D, HEADS = 16, 2


class RotaryModule(torch.nn.Module):
    """A projection to [B, H, S, D] and a rotary embedding written as the variant says:
    ``half`` (rotate_half), ``interleaved`` (GPT-J's rotate_every_two, repeat_interleave'd
    tables), and near misses: ``wrong_sign`` (cat(x1, -x2)), ``wrong_split`` (halves at D/4),
    ``mixed_tables`` (the second half's angles doubled: not a rotation table)."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)),
                             persistent=False)
        self.proj = torch.nn.Linear(32, HEADS * D)

    def forward(self, x, position_ids):
        b, s, _ = x.shape
        q = self.proj(x).view(b, s, HEADS, D).transpose(1, 2)
        freqs = position_ids[..., None].float() * self.inv_freq  # [B, S, D/2]
        if self.variant == "interleaved":
            cos = torch.repeat_interleave(freqs.cos(), 2, dim=-1)[:, None]
            sin = torch.repeat_interleave(freqs.sin(), 2, dim=-1)[:, None]
            rot = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1).flatten(-2)
            return q * cos + rot * sin
        emb = torch.cat((freqs, 2 * freqs if self.variant == "mixed_tables" else freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        h = D // 4 if self.variant == "wrong_split" else D // 2
        x1, x2 = q[..., :h], q[..., h:]
        rot = torch.cat((x1, -x2) if self.variant == "wrong_sign" else (-x2, x1), dim=-1)
        return q * cos + rot * sin


def _export_rotary(variant: str, path, opset: int = 18):
    module = RotaryModule(variant).eval()
    torch.manual_seed(0)
    args = (torch.randn(1, 5, 32), torch.arange(5)[None])
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("sequence", max=1024)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=True, opset_version=opset,
                          input_names=["x", "position_ids"], output_names=["y"],
                          dynamic_shapes=(dims, dims), external_data=False, verbose=False)
    return module, str(path)


def _numpy_rotary(q: np.ndarray, pos: np.ndarray, interleaved: bool) -> np.ndarray:
    """RoFormer's rotation of q [B, H, S, D] at positions pos [B, S], in float64."""
    inv = 1.0 / (10000 ** (np.arange(0, D, 2) / D))
    ang = pos[:, None, :, None].astype(np.float64) * inv  # [B, 1, S, D/2]
    c, s = np.cos(ang), np.sin(ang)
    if interleaved:
        x1, x2 = q[..., 0::2], q[..., 1::2]
        return np.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(q.shape)
    x1, x2 = q[..., :D // 2], q[..., D // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@pytest.mark.parametrize("variant,opset,lower,kind,count", [
    ("interleaved", 18, "lower-onnxruntime", ("com.microsoft", "RotaryEmbedding"), 1),
    ("interleaved", 18, "lower-standard", ("", "Gather"), 2),  # decomposed: cos and sin rows
    ("interleaved", 23, "lower-standard", ("", "RotaryEmbedding"), 1),
    ("half", 23, "lower-standard", ("", "RotaryEmbedding"), 1),
    ("half", 18, "lower-standard", ("", "Gather"), 2),
])
def test_rotary_module_fuses_and_matches_numpy_and_torch(tmp_path, variant, opset, lower, kind,
                                                         count):
    """interleaved=1 for rotate_every_two, 0 for rotate_half; each lowering (contrib kernel,
    standard ops, RotaryEmbedding-23) against a float64 numpy RoFormer rotation of the module's own
    projection and against torch eager, at positions the export never saw (batch 3, length 7)."""
    module, path = _export_rotary(variant, tmp_path / "rot.onnx", opset)
    rewritten, stats = _rewrite(path, PIPE + [lower], **{"fuse-rotary": {"max_positions": 64}})
    # NOTE: at opset 23 the exporter itself writes rotate_half as ONNX RotaryEmbedding with
    # computed cos/sin (rule 3); interleaved stays decomposed.
    rule = "onnx-23" if (variant, opset) == ("half", 23) else (
        "interleaved" if variant == "interleaved" else "rotate-half")
    assert stats["fuse-rotary"][rule] == 1
    assert sum(op == kind for op in _ops(rewritten)) == count
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 7, 32)).astype(np.float32)
    pos = rng.integers(0, 64, (3, 7)).astype(np.int64)
    got = run_onnxruntime(to_onnx(rewritten), {"x": x, "position_ids": pos})["y"]
    with torch.no_grad():
        q = module.proj(torch.from_numpy(x)).view(3, 7, HEADS, D).transpose(1, 2).double().numpy()
        eager = module(torch.from_numpy(x), torch.from_numpy(pos)).numpy()
    assert _rel(got, _numpy_rotary(q, pos, variant == "interleaved")) < 1e-5
    assert _rel(got, eager) < 1e-5


@pytest.mark.parametrize("variant,reason", [
    ("wrong_sign", "not Concat(Neg(x2), x1)"),
    ("wrong_split", "the halves are"),
    ("mixed_tables", "halves differ"),
])
def test_near_misses_are_left_alone_with_a_reason(tmp_path, variant, reason):
    """Almost rotary but not: nothing fused, the graph computes what it did, and ``unfused`` says
    why."""
    _, path = _export_rotary(variant, tmp_path / "rot.onnx")
    rewritten, stats = _rewrite(path, PIPE)
    assert stats["fuse-rotary"]["fused"] == 0
    assert any(reason in line for line in stats["fuse-rotary"]["unfused"]), stats
    assert not any(op[0] == "passctl" for op in _ops(rewritten))


def test_positions_from_two_inputs_are_refused(tmp_path):
    """cos/sin that also read another input (here x's mean shifts the angle) are no rotary
    tables of position_ids: nothing fused."""

    class Shifted(RotaryModule):
        def forward(self, x, position_ids):
            b, s, _ = x.shape
            q = self.proj(x).view(b, s, HEADS, D).transpose(1, 2)
            freqs = (position_ids[..., None].float() + x.mean(-1, keepdim=True)) * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            rot = torch.cat((-q[..., D // 2:], q[..., :D // 2]), dim=-1)
            return q * emb.cos()[:, None] + rot * emb.sin()[:, None]

    module = Shifted("half").eval()
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("sequence", max=1024)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(1, 5, 32), torch.arange(5)[None]),
                          str(tmp_path / "s.onnx"), dynamo=True, opset_version=18,
                          input_names=["x", "position_ids"], output_names=["y"],
                          dynamic_shapes=(dims, dims), external_data=False, verbose=False)
    _, stats = _rewrite(tmp_path / "s.onnx", PIPE)
    assert stats["fuse-rotary"]["fused"] == 0
    assert any("not on one int64" in line for line in stats["fuse-rotary"]["unfused"])


def test_opt_runs_fuse_rotary_from_the_command_line(cli, tmp_path):
    """``passctl opt model.onnx -p ...fuse-rotary...`` prints IR with the canonical op, and a
    pipeline option that is no integer is one line, exit 2."""
    _, path = _export_rotary("half", tmp_path / "rot.onnx")
    res = cli("opt", path, "-p", "infer-shapes,fuse-rotary{max_positions=32},dce")
    assert res.rc == 0, res.err
    assert res.out.count("passctl::RotaryEmbedding(") == 1
    assert "f32[32,8]" in res.out  # the caches: max_positions rows, D/2 columns
    bad = cli("opt", path, "-p", "fuse-rotary{max_positions=many}")
    assert bad.rc == 2 and len(bad.err.strip().splitlines()) == 1 and "max_positions" in bad.err
    assert onnx.load(path)  # the input file is untouched


@pytest.mark.parametrize("lower,opset,kind", [
    ("lower-onnxruntime", 23, ("com.microsoft", "RotaryEmbedding")),
    ("lower-standard", 23, ("", "RotaryEmbedding")),
    ("lower-standard", 18, ("", "Gather")),  # decomposed, with the pass-through part
])
def test_partial_rotary_from_onnx_23_lowers_to_every_form(tmp_path, lower, opset, kind):
    """ONNX RotaryEmbedding-23 with rotary_embedding_dim 4 of head size 8 and cos/sin computed
    from position_ids (rule 3): one canonical op keeping the partial dim, and each lowering gives
    ONNX Runtime's result on the original graph (opset 18: the canonical graph re-declared at
    opset 18, so only the decomposed form applies)."""
    from onnx import TensorProto, helper, numpy_helper

    inv = numpy_helper.from_array(np.array([1.0, 0.01], np.float32), "inv")
    axis = numpy_helper.from_array(np.array([2], np.int64), "axis")
    nodes = [helper.make_node("Unsqueeze", ["position_ids", "axis"], ["pu"]),
             helper.make_node("Cast", ["pu"], ["pf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["pf", "inv"], ["f"]),
             helper.make_node("Cos", ["f"], ["c"]), helper.make_node("Sin", ["f"], ["s"]),
             helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"], rotary_embedding_dim=4)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, "S", 8]),
                     helper.make_tensor_value_info("position_ids", TensorProto.INT64, [2, "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, "S", 8])], [inv, axis])
    path = tmp_path / "partial.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), str(path))
    model, stats = _rewrite(path, PIPE, **{"fuse-rotary": {"max_positions": 16}})
    assert stats["fuse-rotary"]["onnx-23"] == 1
    (node,) = [n for n in model.graph if n.domain == "passctl"]
    assert node.attr("rotary_embedding_dim") == 4
    model.opset_imports[""] = opset
    get_pass(lower)().run(model)
    assert kind in _ops(model)
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, 5, 8)).astype(np.float32),
             "position_ids": rng.integers(0, 16, (2, 5)).astype(np.int64)}
    ref = run_onnxruntime(str(path), feeds)["y"]
    got = run_onnxruntime(to_onnx(model), feeds)["y"]
    assert _rel(got, ref) < 1e-6
    np.testing.assert_array_equal(got[..., 4:], feeds["x"][..., 4:])  # the pass-through part
