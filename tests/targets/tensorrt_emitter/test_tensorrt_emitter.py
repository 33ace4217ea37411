"""TensorRT emitter: the artifact (ONNX, precision, profile, trtexec script) and its refusals."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest

from passctl.ir import from_onnx, load
from passctl.ir.errors import UserError
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.targets import get_emitter, get_target
from passctl.targets.tensorrt import TensorRTEmitter
from passctl.targets.tensorrt.engine import engine_unavailable
from passctl.targets.tensorrt.shapes import parse_shape_ranges, trtexec_shapes
from passctl.targets.tensorrt.support import UNSUPPORTED_OPS
from passctl.tools.run_artifact import run_artifact

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from corpus import package_file  # noqa: E402

CLS = ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
CLS_SHAPES = 'x[0]=1:4:16,x[2]=48,x[3]=192:192:320'


def _run(path, feeds):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module")
def cls_artifact(tmp_path_factory):
    """PP-OCR cls through cleanup,fuse for a10 with the TensorRT emitter (real weights)."""
    source = package_file(*CLS)
    model = load(source)
    PassManager(build_pipeline("cleanup,fuse", "a10", "tensorrt")).run(model)
    out = str(tmp_path_factory.mktemp("trt") / "cls")
    info = TensorRTEmitter(shapes=CLS_SHAPES).emit(model, get_target("a10"), out)
    return source, out, info


def test_cls_artifact_matches_the_original_across_the_profile(cls_artifact):
    source, out, info = cls_artifact
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert manifest["schema"] == "passctl.tensorrt.artifact/1" and manifest["strongly_typed"]
    assert manifest["optimization_profile"] == {"x": {"min": [1, 3, 48, 192], "opt": [4, 3, 48, 192],
                                                      "max": [16, 3, 48, 320]}}
    assert sorted(os.listdir(out)) == ["build_engine.sh", "manifest.json", "model.onnx",
                                       "precision.json"]
    rng = np.random.default_rng(0)
    sessions = [ort.InferenceSession(p, providers=["CPUExecutionProvider"])
                for p in (source, os.path.join(out, "model.onnx"))]
    for row in ("min", "opt", "max"):  # the emitted network at every corner of the profile
        shape = manifest["optimization_profile"]["x"][row]
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        want, got = (s.run(None, feeds)[0] for s in sessions)
        assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), row


def test_cls_artifact_is_standard_onnx_with_a_trtexec_script(cls_artifact):
    _, out, _ = cls_artifact
    proto = onnx.load(os.path.join(out, "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    ops = {(n.domain or "", n.op_type) for n in proto.graph.node}
    assert all(domain in ("", "ai.onnx") for domain, _ in ops), ops
    assert not {op for _, op in ops} & UNSUPPORTED_OPS
    script = open(os.path.join(out, "build_engine.sh")).read()
    assert ("trtexec --onnx=model.onnx --saveEngine=model.engine --stronglyTyped --noTF32 "
            "--minShapes=x:1x3x48x192 --optShapes=x:4x3x48x192 --maxShapes=x:16x3x48x320") in script
    assert os.access(os.path.join(out, "build_engine.sh"), os.X_OK)


def test_cls_engine_is_built_or_the_reason_is_recorded(cls_artifact):
    _, out, _ = cls_artifact
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    why = engine_unavailable(get_target("a10"))
    if why is None:  # a machine with TensorRT and an A10
        assert manifest["engine"] == "model.engine" and os.path.getsize(os.path.join(out, "model.engine"))
    else:
        assert manifest["engine"] is None and why in manifest["engine_note"]
        assert "build_engine.sh" in manifest["engine_note"]


def test_precision_table_matches_onnx_shape_inference(cls_artifact):
    """Each layer's precision is the element type ONNX shape inference gives its first float output."""
    _, out, _ = cls_artifact
    table = json.load(open(os.path.join(out, "precision.json")))
    proto = onnx.shape_inference.infer_shapes(onnx.load(os.path.join(out, "model.onnx")))
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(proto.graph.value_info) + list(proto.graph.output) + list(proto.graph.input)}
    types.update({i.name: i.data_type for i in proto.graph.initializer})
    assert len(table["layers"]) == len(proto.graph.node)
    for layer, node in zip(table["layers"], proto.graph.node):
        assert layer["op"] == node.op_type and layer["output"] == node.output[0]
        out_types = [types[o] for o in node.output if o in types]
        floats = [t for t in out_types if onnx.helper.tensor_dtype_to_np_dtype(t).kind == "f"]
        want = (floats or out_types)[0]
        assert layer["precision"] == onnx.helper.tensor_dtype_to_np_dtype(want).name, layer
    assert sum(table["summary"].values()) == len(proto.graph.node)


def test_passctl_run_uses_the_profile_opt_shape(cls_artifact):
    _, out, _ = cls_artifact
    kind, outputs, times = run_artifact(out, runs=1, warmup=0)
    assert kind == "tensorrt" and len(times) == 1
    (name, got), = outputs.items()
    assert got.shape == (4, 2)  # OPT batch 4
    proto = onnx.load(os.path.join(out, "model.onnx"))
    from passctl.support.inputs import make_inputs
    feeds = make_inputs(proto, seed=0, dim_values={"x[0]": 4, "x[2]": 48, "x[3]": 192})
    np.testing.assert_allclose(got, _run(package_file(*CLS), feeds)[0], rtol=1e-5, atol=1e-6)


def _graph(nodes, inputs, outputs, initializers=(), opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


def _vi(name, shape, dtype=onnx.TensorProto.FLOAT):
    return oh.make_tensor_value_info(name, dtype, shape)


def _emit(proto, tmp_path, **options):
    out = tmp_path / "out"
    TensorRTEmitter(**options).emit(from_onnx(proto), get_target("a10"), str(out))
    return out


@pytest.mark.parametrize("case, message", [
    ("unique", "node 'u' (Unique): Unique is not supported by TensorRT 10.15"),
    ("contrib", "node 'g' (com.microsoft::FastGelu): TensorRT's ONNX parser has no 'com.microsoft' "
                "operators"),
    ("topk", "node 't' (TopK): TensorRT's ONNX parser requires that K must be an initializer"),
    ("resize", "node 'r' (Resize): TensorRT's ONNX parser requires that mode 'cubic' is not supported"),
    ("qdq", "node 'q' (QuantizeLinear): TensorRT's ONNX parser requires that the zero point must be 0"),
    ("opset", "opset 8 is outside TensorRT 10.15's ONNX parser range 9..24"),
])
def test_unsupported_graphs_are_refused_before_writing(case, message, tmp_path):
    x = _vi("x", [1, 4, 8, 8])
    y = _vi("y", None)
    if case == "unique":
        proto = _graph([oh.make_node("Unique", ["x"], ["y"], name="u")], [x], [y])
    elif case == "contrib":
        proto = _graph([oh.make_node("FastGelu", ["x"], ["y"], name="g", domain="com.microsoft")],
                       [x], [y])
        proto.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    elif case == "topk":
        proto = _graph([oh.make_node("TopK", ["x", "k"], ["y", "i"], name="t")],
                       [x, _vi("k", [1], onnx.TensorProto.INT64)], [y, _vi("i", None, onnx.TensorProto.INT64)])
    elif case == "resize":
        scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
        proto = _graph([oh.make_node("Resize", ["x", "", "s"], ["y"], name="r", mode="cubic")], [x], [y],
                       [scales])
    elif case == "qdq":
        scale = onnx.numpy_helper.from_array(np.array(0.1, np.float32), "sc")
        zero = onnx.numpy_helper.from_array(np.array(3, np.int8), "zp")
        proto = _graph([oh.make_node("QuantizeLinear", ["x", "sc", "zp"], ["y"], name="q")], [x],
                       [_vi("y", None, onnx.TensorProto.INT8)], [scale, zero])
    else:
        proto = _graph([oh.make_node("Relu", ["x"], ["y"], name="r")], [x], [y], opset=8)
    with pytest.raises(UserError) as info:
        _emit(proto, tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_dynamic_dims_need_ranges(tmp_path):
    proto = _graph([oh.make_node("Relu", ["x"], ["y"], name="r")],
                   [_vi("x", ["batch", 3, None])], [_vi("y", ["batch", 3, None])])
    with pytest.raises(UserError, match=r"missing: batch, x\[2\]; give them as --emit "
                                        r"'tensorrt\{shapes=\"batch=MIN:OPT:MAX,x\[2\]=MIN:OPT:MAX\"\}'"):
        _emit(proto, tmp_path)
    with pytest.raises(UserError, match="dims name 'batchh' matches no dim"):
        _emit(proto, tmp_path, shapes="batchh=2,x[2]=5")
    out = _emit(proto, tmp_path, shapes="batch=1:2:8,x[2]=5")
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["optimization_profile"] == {"x": {"min": [1, 3, 5], "opt": [2, 3, 5],
                                                      "max": [8, 3, 5]}}
    assert manifest["inputs"] == [{"name": "x", "shape": ["batch", 3, None], "dtype": "float32"}]


def test_static_model_has_no_profile_and_tf32_is_opt_in(tmp_path):
    proto = _graph([oh.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    manifest = json.load(open(_emit(proto, tmp_path, tf32=True, workspace_mb=256) / "manifest.json"))
    assert manifest["optimization_profile"] is None
    assert manifest["trtexec"] == ["trtexec", "--onnx=model.onnx", "--saveEngine=model.engine",
                                   "--stronglyTyped", "--memPoolSize=workspace:256M"]


@pytest.mark.parametrize("text, message", [
    ("batch=0", "needs 0 < MIN <= OPT <= MAX"),
    ("batch=4:2:8", "needs 0 < MIN <= OPT <= MAX"),
    ("batch=1:2", "is not NAME=SIZE or NAME=MIN:OPT:MAX"),
    ("batch", "is not NAME=SIZE or NAME=MIN:OPT:MAX"),
    ("batch=1,batch=2", "'batch' is given twice"),
])
def test_bad_shape_ranges(text, message):
    with pytest.raises(UserError, match=message):
        parse_shape_ranges(text)


def test_trtexec_shapes_quote_names_with_separators():
    profile = {"input:0": {"min": [1, 2], "opt": [1, 2], "max": [1, 2]},
               "mask": {"min": [1], "opt": [4], "max": [8]}}
    assert trtexec_shapes(profile, "opt") == "'input:0':1x2,mask:4"


def test_emitter_options_and_refusals():
    emitter = get_emitter('tensorrt{shapes="batch=1:2:4,seq=128",build=false,tf32=true}')
    assert isinstance(emitter, TensorRTEmitter)
    assert emitter.ranges == {"batch": (1, 2, 4), "seq": (128, 128, 128)}
    assert emitter.build is False and emitter.tf32 is True
    with pytest.raises(UserError, match="TensorRT runs on NVIDIA GPUs"):
        emitter.preflight(get_target("cpu"))
    why = engine_unavailable(get_target("h200"))
    if why is not None:
        with pytest.raises(UserError, match="build=true, but " + why.split(" (")[0]):
            TensorRTEmitter(build=True).preflight(get_target("h200"))


def test_write_refuses_what_preflight_refuses(tmp_path):
    """write() called without preflight (the Python API) applies the same refusals before writing."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])
    model = from_onnx(oh.make_model(oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g",
                                                  [x], [y]), opset_imports=[oh.make_opsetid("", 17)]))
    with pytest.raises(UserError, match="TensorRT runs on NVIDIA GPUs"):
        TensorRTEmitter(build=False).write(model, get_target("cpu"), str(tmp_path))
    why = engine_unavailable(get_target("h200"))
    if why is not None:
        with pytest.raises(UserError, match="build=true, but " + why.split(" (")[0]):
            TensorRTEmitter(build=True).write(model, get_target("h200"), str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_amp_layers_are_recorded_per_precision(tmp_path):
    """amp's fp16 layers reach precision.json as float16, the rest float32 (ONNX inference decides)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "passes", "precision"))
    from amp_graphs import layernorm_model

    model = from_onnx(layernorm_model())
    PassManager(build_pipeline("amp", "a10", "tensorrt")).run(model)
    out = tmp_path / "ln"
    TensorRTEmitter().emit(model, get_target("a10"), str(out))
    table = json.load(open(out / "precision.json"))
    proto = onnx.shape_inference.infer_shapes(onnx.load(str(out / "model.onnx")))
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(proto.graph.value_info) + list(proto.graph.output)}
    want = {node.output[0]: onnx.helper.tensor_dtype_to_np_dtype(types[node.output[0]]).name
            for node in proto.graph.node}
    assert {layer["output"]: layer["precision"] for layer in table["layers"]} == want
    assert table["summary"].get("float16", 0) >= 1 and table["summary"]["float32"] >= 1


@pytest.mark.slow
def test_minilm_amp_for_tensorrt_matches_the_original(tmp_path):
    """MiniLM (real weights) through cleanup,fuse,flash-attn,amp for a10: every op passes TensorRT's
    support matrix, the fp16 layers are in precision.json, and model.onnx stays within amp's budget
    of the original at the profile's OPT sizes (ONNX Runtime on both)."""
    from corpus import corpus_path
    from passctl.support.inputs import make_inputs

    source = corpus_path("minilm_legacy")
    model = load(source)
    PassManager(build_pipeline("cleanup,fuse,flash-attn,amp", "a10", "tensorrt")).run(model)
    out = tmp_path / "minilm"
    TensorRTEmitter(shapes="batch=1:2:8,sequence=16:64:256").emit(model, get_target("a10"), str(out))
    table = json.load(open(out / "precision.json"))
    assert table["summary"]["float16"] > 100 and table["summary"]["float32"] >= 1
    feeds = make_inputs(source, seed=1, dim_values={"batch": 2, "sequence": 64})
    for want, got in zip(_run(source, feeds), _run(str(out / "model.onnx"), feeds)):
        got = got.astype(np.float64)
        assert np.abs(got - want).sum() / np.abs(want).sum() <= 1e-2  # amp's default budget (mean-rel)


def test_a_range_on_a_static_axis_is_refused(tmp_path):
    proto = _graph([oh.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [2, "n"])],
                   [_vi("y", [2, "n"])])
    with pytest.raises(UserError, match=r"axis 0 of input 'x' is static with size 2, so the range "
                                        r"1:2:4 cannot apply"):
        _emit(proto, tmp_path, shapes="x[0]=1:2:4,n=3")
    out = _emit(proto, tmp_path, shapes="x[0]=2,n=3")  # the static size itself is accepted
    assert json.load(open(out / "manifest.json"))["optimization_profile"]["x"]["max"] == [2, 3]


def test_manifest_names_external_data_only_when_written(tmp_path):
    """ir.save keeps initializers under 1 KiB inline whatever the threshold."""
    w = onnx.numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    proto = _graph([oh.make_node("MatMul", ["x", "w"], ["y"], name="m")], [_vi("x", [2, 2])],
                   [_vi("y", [2, 2])], [w])
    out = _emit(proto, tmp_path, external_data_threshold=0)
    manifest = json.load(open(out / "manifest.json"))
    assert manifest["external_data"] is None and not (out / "model.onnx.data").exists()
    big = onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    proto = _graph([oh.make_node("MatMul", ["x", "w"], ["y"], name="m")], [_vi("x", [2, 64])],
                   [_vi("y", [2, 64])], [big])
    out = tmp_path / "big"
    TensorRTEmitter(external_data_threshold=0).emit(from_onnx(proto), get_target("a10"), str(out))
    assert json.load(open(out / "manifest.json"))["external_data"] == "model.onnx.data"
    assert (out / "model.onnx.data").stat().st_size == 64 * 64 * 4


@pytest.mark.parametrize("options, message", [
    (dict(external_data_threshold=-1), "external_data_threshold=-1: give a size in bytes"),
    (dict(workspace_mb=100000000), "workspace_mb=100000000 is more than its 24 GB of memory"),
])
def test_bad_sizes_are_refused(options, message):
    with pytest.raises(UserError, match=message):
        TensorRTEmitter(**options).preflight(get_target("a10"))


@pytest.mark.parametrize("pipeline, why", [
    ("quantize{activations=uint8}", "activations=uint8"),
    ("quantize{target=cpu}", "target=cpu"),
])
def test_quantize_uint8_form_is_refused_before_the_passes(pipeline, why):
    from passctl.passes.manager import PassManager as PM

    flat = PM(build_pipeline(pipeline, "a10", "tensorrt")).flat_passes()
    with pytest.raises(UserError, match=f"quantize-int8{{{why}}} writes uint8 activations with "
                                        "zero point 128, and TensorRT requires zero points of 0"):
        TensorRTEmitter().check_passes(flat)
    TensorRTEmitter().check_passes(PM(build_pipeline("quantize", "a10", "tensorrt")).flat_passes())


def test_run_warns_outside_the_profile(cls_artifact, tmp_path, caplog):
    _, out, _ = cls_artifact
    feeds = tmp_path / "big.npz"
    np.savez(feeds, x=np.zeros((32, 3, 48, 192), np.float32))  # batch 32 > the profile's max 16
    with caplog.at_level("WARNING"):
        run_artifact(out, inputs=str(feeds), runs=1, warmup=0)
    assert "outside the engine's optimization profile (min [1, 3, 48, 192], max [16, 3, 48, 320])" \
        in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        run_artifact(out, runs=1, warmup=0)
    assert "optimization profile" not in caplog.text


def _dq_matmul(q, scale, k, n, opset=21, zero_point=None, **attrs):
    """x [2, k] -> MatMul(x, DequantizeLinear(q, scale[, zero_point], **attrs)) -> y [2, n]."""
    inits = [q, scale] + ([zero_point] if zero_point is not None else [])
    dq = oh.make_node("DequantizeLinear", [t.name for t in inits], ["wd"], name="dq", **attrs)
    mm = oh.make_node("MatMul", ["x", "wd"], ["y"], name="mm")
    return _graph([dq, mm], [_vi("x", [2, k])], [_vi("y", [2, n])], inits, opset=opset)


def _no_optimization():
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options


def _int4(name, codes):
    return oh.make_tensor(name, onnx.TensorProto.INT4, list(codes.shape),
                          codes.reshape(-1).astype(np.int8).tolist())


def test_weight_only_int4_and_int8_dequantize_forms_are_accepted(tmp_path):
    """INT4 blocked (axis 0, block 64 / 128, positive scales, no zero point) and int8 per
    channel pass the support table, and the written model is what ONNX Runtime runs to numpy's
    dequantize-then-matmul."""
    rng = np.random.default_rng(5)
    k, n = 128, 24
    q = rng.integers(-8, 8, (k, n))
    x = rng.standard_normal((2, k)).astype(np.float32)
    for block in (64, 128):
        s = rng.uniform(0.01, 0.1, (k // block, n)).astype(np.float32)
        proto = _dq_matmul(_int4("q", q), onnx.numpy_helper.from_array(s, "s"), k, n, axis=0,
                           block_size=block)
        out = _emit(proto, tmp_path / f"b{block}")
        written = onnx.load(str(out / "model.onnx"))
        assert written.graph.initializer[0].data_type == onnx.TensorProto.INT4
        want = x.astype(np.float64) @ (q * np.repeat(s.astype(np.float64), block, axis=0))
        # optimizations off: at ORT_ENABLE_ALL ONNX Runtime fuses DQ -> MatMul into MatMulNBits
        # with int8 activations (0.6% here), which is ONNX Runtime's choice, not the model's
        sess = ort.InferenceSession(str(out / "model.onnx"), _no_optimization(),
                                    providers=["CPUExecutionProvider"])
        got = sess.run(None, {"x": x})[0]
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        table = json.load(open(out / "precision.json"))
        assert [r["precision"] for r in table["layers"]] == ["float32", "float32"]
    q8 = onnx.numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "q")
    s8 = onnx.numpy_helper.from_array(rng.uniform(0.01, 0.1, n).astype(np.float32), "s")
    _emit(_dq_matmul(q8, s8, k, n, opset=17, axis=1), tmp_path / "i8")


@pytest.mark.parametrize("case, message", [
    ("negative", "every scale must be > 0 (Scale coefficients must all be positive)"),
    ("uint4", "the zero point must be 0"),
    ("uint8", "the quantized data is int8, int4 or fp8 (not uint8)"),
    ("block32", "block_size is 64 or 128 (it is 32)"),
    ("ragged", "the blocked axis (96) is a multiple of block_size 64"),
    ("int8-blocked", "block quantization is for int4 data only (this is int8)"),
    ("channels", "a per-channel scale has dims[axis] = 24 entries (it has 23)"),
])
def test_dequantize_forms_tensorrt_refuses(case, message, tmp_path):
    rng = np.random.default_rng(6)
    k, n = (96 if case == "ragged" else 128), 24
    s = rng.uniform(0.01, 0.1, (k // 64 if case != "block32" else k // 32, n)).astype(np.float32)
    attrs = dict(axis=0, block_size=32 if case == "block32" else 64)
    zero_point = None
    q = _int4("q", rng.integers(-8, 8, (k, n)))
    if case == "negative":
        s[0, 0] = -s[0, 0]
    if case == "uint4":
        q = oh.make_tensor("q", onnx.TensorProto.UINT4, [k, n], rng.integers(0, 16, k * n).tolist())
        zero_point = oh.make_tensor("zp", onnx.TensorProto.UINT4, list(s.shape),
                                    [8] * s.size)
    if case == "int8-blocked":
        q = onnx.numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "q")
    if case in ("uint8", "channels"):
        dtype = np.uint8 if case == "uint8" else np.int8
        q = onnx.numpy_helper.from_array(rng.integers(0, 100, (k, n)).astype(dtype), "q")
        s = rng.uniform(0.01, 0.1, 23 if case == "channels" else n).astype(np.float32)
        attrs = dict(axis=1)
    proto = _dq_matmul(q, onnx.numpy_helper.from_array(s, "s"), k, n, zero_point=zero_point,
                       **attrs)
    with pytest.raises(UserError) as info:
        _emit(proto, tmp_path)
    text = str(info.value)
    assert "node 'dq' (DequantizeLinear): TensorRT's ONNX parser requires that " + message in text
    assert "\n" not in text and not (tmp_path / "out").exists()
