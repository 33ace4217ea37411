"""CUDA builds of BERT-like passctl artifacts for sm_90 (source compiled by nvcc here) and fp16 attention."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from corpus import cached_export
from onnx import TensorProto, helper
from tvm_helpers import attention_numpy, attention_proto, emit_tvm, rel_err, run_tvm

from passctl.ir import from_onnx, load
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.targets import get_target
from passctl.targets.tvm.names import safe_value_names

BATCH, SEQ = 2, 16


def _export_bert(path, fp16: bool) -> None:
    """transformers BERT, 2 layers, hidden 64, 4 heads, eager attention, random weights plus
    :func:`zoo_export.add_noise`, static [2, 16] inputs (the zoo's wrapper, legacy exporter)."""
    from corpus_export import BERT_INPUTS, _bert_wrapper, _offline_torch
    from zoo_export import add_noise

    torch, transformers = _offline_torch()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    add_noise(model)
    model = model.half() if fp16 else model
    args = (torch.randint(0, 100, (BATCH, SEQ)), torch.ones(BATCH, SEQ, dtype=torch.int64),
            torch.zeros(BATCH, SEQ, dtype=torch.int64))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_bert_wrapper(model), args, str(path), dynamo=False, opset_version=17,
                          input_names=list(BERT_INPUTS), output_names=["last_hidden_state"])


@pytest.mark.parametrize("dtype,pipeline", [("fp32", "cleanup,fuse"),
                                            ("fp16", "cleanup,fuse"),
                                            ("fp16", "cleanup,fuse,flash-attn")])
def test_bert_cuda_source_compiles_for_sm90(dtype, pipeline):
    """The h200 build's CUDA source compiles with nvcc for sm_90. Before the fix the weights'
    ONNX names (``/bert/embeddings/.../Gather_output_0``) became kernel parameter names (nvcc: 6
    errors), and an fp16 passctl::Attention legalized to a float32 output (Relax TypeError)."""
    from passctl.targets.tvm.build import check_cuda_source, compile_module, cuda_source
    from passctl.targets.tvm.emit import _translate
    from passctl.targets.tvm.support import tvm_target

    path = cached_export(f"tvm-cuda-bert-{dtype}-r2", lambda p: _export_bert(p, dtype == "fp16"))
    raw = onnx.load(path)
    assert any("/" in t.name for t in raw.graph.initializer) or any(
        "/" in o for n in raw.graph.node for o in n.output)  # the names that broke nvcc
    model = load(path)
    PassManager(build_pipeline(pipeline + ",lower-tvm", "h200", "tvm")).run(model)
    if "flash-attn" in pipeline:
        assert any(n.op_type == "Attention" for n in model.graph.all_nodes())
    target = tvm_target(get_target("h200"))
    mod, _ = _translate(model, "bert")
    executable, _ = compile_module(mod, target, tensorize=False)
    source = cuda_source(executable)
    assert "__global__" in source
    signatures = re.findall(r"__global__ void[^(]*\(([^)]*)\)", source)
    assert signatures and not any("/" in s for s in signatures)
    check_cuda_source(source, "sm_90")  # raises with nvcc's error lines


def test_check_cuda_source_reports_nvcc_errors():
    """A kernel parameter named like an ONNX value is what nvcc rejected on the H200."""
    from passctl.targets.tvm.build import check_cuda_source

    bad = 'extern "C" __global__ void k(float* __restrict__ /bert/x_ptr) { }\n'
    with pytest.raises(RuntimeError, match=r"error: expected a \"\)\""):
        check_cuda_source(bad, "sm_90")


def test_safe_value_names_renames_every_use():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "/w/0"], ["/a/out"], name="add"),
         helper.make_node("Relu", ["/a/out"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor("/w/0", TensorProto.FLOAT, [2], [1.0, 2.0])])
    mapping = safe_value_names(graph)
    assert set(mapping) == {"/w/0", "/a/out"}
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) for v in mapping.values())
    assert graph.initializer[0].name == mapping["/w/0"] == graph.node[0].input[1]
    assert graph.node[0].output[0] == mapping["/a/out"] == graph.node[1].input[0]
    assert graph.input[0].name == "x" and graph.output[0].name == "y"


@pytest.mark.parametrize("mask_kind,causal", [("additive", 0), ("none", 1)])
def test_fp16_attention_matches_numpy(tmp_path, mask_kind, causal):
    """fp16 passctl::Attention (decomposed with float32 scores) on llvm vs numpy in float64."""
    h, hkv, s, d = 4, 2, 8, 16
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal((1, c, s, d)).astype(np.float16)
             for n, c in (("q", h), ("k", hkv), ("v", hkv))}
    bias = np.zeros((s, s))
    if mask_kind == "additive":
        feeds["m"] = np.where(rng.random((1, 1, s, s)) < 0.3, -1e4, 0).astype(np.float16)
        bias = feeds["m"][0, 0].astype(np.float64)
    else:
        bias = np.triu(np.full((s, s), -np.inf), 1)
    proto = attention_proto(TensorProto.FLOAT16, h, hkv, s, d, mask_kind, causal)
    emit_tvm(from_onnx(proto), tmp_path / "a", self_check=False)
    got = run_tvm(tmp_path / "a", feeds)["y"]
    assert got.dtype == np.float16
    want = attention_numpy(feeds["q"], feeds["k"], feeds["v"], 0.25, bias)
    assert rel_err(got, want) < 3e-3
