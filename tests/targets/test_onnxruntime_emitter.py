"""ONNX Runtime emitter: files, session.json per target, external data, atomic output, load test."""

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from passctl.ir.onnx_import import from_onnx
from passctl.targets import EmitError, get_target
from passctl.targets.onnxruntime import OnnxRuntimeEmitter, create_session, session_config


def _conv_relu_proto(op="Relu") -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node(op, ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    sess = ort.InferenceSession(model if isinstance(model, str) else model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


X = np.random.default_rng(0).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)


def test_emit_cpu_writes_loadable_model_and_session(tmp_path):
    proto = _conv_relu_proto()
    out = tmp_path / "out"
    info = OnnxRuntimeEmitter().emit(from_onnx(proto), get_target("cpu"), str(out))
    assert sorted(os.listdir(out)) == ["model.onnx", "session.json"]
    assert info["external_data"] is False
    assert info["weight_bytes"] == (16 * 3 * 3 * 3 + 16) * 4
    assert info["load_check"]["ok"] and info["load_check"]["provider"] == "CPUExecutionProvider"
    assert info["load_check"]["inputs"] == ["x"] and info["load_check"]["outputs"] == ["y"]
    np.testing.assert_array_equal(_run(str(out / "model.onnx"), X), _run(proto, X))
    cfg = json.loads((out / "session.json").read_text())
    assert cfg["execution_providers"] == [["CPUExecutionProvider", {}]]
    assert cfg["optional_execution_providers"] == []
    assert cfg["target"]["name"] == "cpu"
    # create_session follows session.json and runs the artifact.
    sess = create_session(str(out))
    assert sess.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], _run(proto, X))


@pytest.mark.parametrize("name", ["a10", "t4", "h200"])
@pytest.mark.parametrize("pipeline, fp16, int8", [
    ("cleanup", False, False),    # fp32: TensorRT must not pick fp16 layers the check never saw
    ("amp", True, False),         # the graph computes in fp16
    ("quantize", False, True),    # explicit Q/DQ: the INT8 builder flag, scales from the graph
])
def test_gpu_session_config(name, pipeline, fp16, int8):
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline

    model = from_onnx(_conv_relu_proto())
    PassManager(build_pipeline(pipeline, name)).run(model)
    cfg = session_config(get_target(name), model)
    assert [p for p, _ in cfg["execution_providers"]] == ["CUDAExecutionProvider",
                                                          "CPUExecutionProvider"]
    (trt_name, trt), = cfg["optional_execution_providers"]
    assert trt_name == "TensorrtExecutionProvider"
    ops = {n.op_type for n in model.graph.all_nodes()}
    assert ("QuantizeLinear" in ops) is int8  # the pipeline did what the row says
    assert trt["trt_fp16_enable"] is fp16 and trt["trt_int8_enable"] is int8
    assert cfg["target"]["compute_capability"] == get_target(name).sm
    assert cfg["graph_optimization_level"] in dir(ort.GraphOptimizationLevel)


def test_gpu_artifact_opens_on_cpu_only_runtime(tmp_path):
    # This ONNX Runtime build has no CUDA provider: create_session falls back to the CPU provider.
    proto = _conv_relu_proto()
    OnnxRuntimeEmitter().emit(from_onnx(proto), get_target("a10"), str(tmp_path / "a10"))
    sess = create_session(str(tmp_path / "a10"))
    assert sess.get_providers()[-1] == "CPUExecutionProvider"
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], _run(proto, X))


def test_run_says_which_provider_ran_and_warns_on_fallback(tmp_path):
    from passctl.tools.run_artifact import _provider_note

    proto = _conv_relu_proto()
    OnnxRuntimeEmitter().emit(from_onnx(proto), get_target("a10"), str(tmp_path / "a10"))
    OnnxRuntimeEmitter().emit(from_onnx(proto), get_target("cpu"), str(tmp_path / "cpu"))
    assert _provider_note(str(tmp_path / "cpu"), "onnxruntime") == " on CPUExecutionProvider"
    note = _provider_note(str(tmp_path / "a10"), "onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert note == " on CUDAExecutionProvider"
    else:  # CI and this machine: a CPU-only ONNX Runtime build
        assert note.startswith(" on CPUExecutionProvider (session.json asks for CUDAExecutionProvider")


def test_large_weights_go_to_external_data(tmp_path):
    proto = _conv_relu_proto()
    out = tmp_path / "ext"
    info = OnnxRuntimeEmitter(external_data_threshold=0).emit(from_onnx(proto), get_target("cpu"),
                                                              str(out))
    assert info["external_data"] is True
    assert "model.onnx.data" in os.listdir(out)
    m = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer)
    np.testing.assert_array_equal(_run(str(out / "model.onnx"), X), _run(proto, X))


def test_failed_finalize_keeps_existing_output(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "marker.txt").write_text("old")

    def boom(folder, info):
        assert os.path.isfile(os.path.join(folder, "model.onnx"))
        raise RuntimeError("check failed")

    with pytest.raises(RuntimeError, match="check failed"):
        OnnxRuntimeEmitter().emit(from_onnx(_conv_relu_proto()), get_target("cpu"), str(out), boom)
    assert os.listdir(out) == ["marker.txt"]
    assert os.listdir(tmp_path) == ["out"]  # no staging folder left behind
    OnnxRuntimeEmitter().emit(from_onnx(_conv_relu_proto()), get_target("cpu"), str(out))
    assert sorted(os.listdir(out)) == ["model.onnx", "session.json"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_model_that_does_not_load_is_an_emit_error(tmp_path):
    proto = _conv_relu_proto(op="NoSuchOp")
    with pytest.raises(EmitError, match="ONNX Runtime cannot load the emitted model"):
        OnnxRuntimeEmitter().emit(from_onnx(proto), get_target("cpu"), str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()
    assert os.listdir(tmp_path) == []


def test_bf16_gpu_artifact_without_a_cpu_kernel_is_validated_by_the_checker(tmp_path):
    """ONNX Runtime's CPU provider has no bfloat16 MatMul; a GPU artifact of an amp{dtype=bf16}
    graph is valid ONNX (CUDA / TensorRT run it), so the load check falls back to onnx.checker."""
    import onnx

    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline
    from passctl.targets.onnx_file import load_check

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    PassManager(build_pipeline("amp{dtype=bf16,measure=false}", "a100")).run(model)
    info = OnnxRuntimeEmitter().emit(model, get_target("a100"), str(tmp_path / "a100"))
    assert info["load_check"]["provider"] is None and "onnx.checker" in info["load_check"]["note"]
    proto = onnx.load(str(tmp_path / "a100" / "model.onnx"))
    assert any(i.data_type == TensorProto.BFLOAT16 for i in proto.graph.initializer)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):  # what the fallback is for
        ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(EmitError, match="ONNX Runtime cannot load the emitted model"):
        load_check(str(tmp_path / "a100" / "model.onnx"))  # a cpu artifact must run on the CPU


@pytest.mark.parametrize("optimize", ["ORT_ENABLE_ALL", False])
def test_load_check_at_either_optimization_level(tmp_path, optimize):
    """The TensorRT emitter's load check runs unoptimized (TensorRT parses the graph as written):
    it still proves the model loads, refuses a broken one, and falls back to onnx.checker for a
    GPU artifact without a CPU kernel, as at the ONNX Runtime artifact's ORT_ENABLE_ALL."""
    from passctl.targets.onnx_file import load_check

    good = str(tmp_path / "good.onnx")
    onnx.save(_conv_relu_proto(), good)
    info = load_check(good, optimize=optimize)
    want = ort.InferenceSession(good, providers=["CPUExecutionProvider"])
    assert info["provider"] == "CPUExecutionProvider"
    assert info["inputs"] == [i.name for i in want.get_inputs()]
    assert info["outputs"] == [o.name for o in want.get_outputs()]
    bad_proto = _conv_relu_proto()
    bad_proto.graph.node[0].input[1] = "missing"
    bad = str(tmp_path / "bad.onnx")
    onnx.save(bad_proto, bad)
    with pytest.raises(EmitError, match="ONNX Runtime cannot load the emitted model"):
        load_check(bad, optimize=optimize)
    w = helper.make_tensor("w", TensorProto.BFLOAT16, [4, 4], [1.0] * 16)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 4])], [w])
    path = str(tmp_path / "bf16.onnx")  # ONNX Runtime's CPU provider has no bfloat16 MatMul
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    info = load_check(path, gpu=True, optimize=optimize)
    assert info["provider"] is None and info["inputs"] == ["x"] and info["outputs"] == ["y"]
