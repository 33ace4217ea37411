"""ONNX import -> export round trips: corpus models, every attribute kind, subgraphs, functions, dtypes."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from passctl.ir import DataType, from_onnx, load, save, to_onnx
from passctl.support.check import run_onnxruntime

from proto_diff import proto_diff


# -- helpers ------------------------------------------------------------------------------------
def normalized(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without what the IR deliberately does not keep apart.

    - an empty ``type {}`` on a ValueInfo carries no information: dropped;
    - ``value_info`` entries naming a graph input/output: the IR has one type per value, the
      input/output declaration's;
    - ``value_info`` entries naming no value of their graph (stale ones): dropped at import;
    - a tensor dim with a negative ``dim_value`` (Paddle2ONNX writes -1 for unknown): the IR reads
      it as an unknown dim (ONNX Runtime's reading), which exports with no value set. Only a
      ValueInfo's tensor shape dims are touched, and only negative ``dim_value`` fields.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)

    def graph(g):
        io = {v.name for v in g.input} | {v.name for v in g.output}
        defined = {o for n in g.node for o in n.output} | {t.name for t in g.initializer}
        keep = [vi for vi in g.value_info if vi.name not in io and vi.name in defined]
        del g.value_info[:]
        g.value_info.extend(keep)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.HasField("type") and vi.type.ByteSize() == 0:
                vi.ClearField("type")
            if vi.type.HasField("tensor_type"):
                for dim in vi.type.tensor_type.shape.dim:
                    if dim.HasField("dim_value") and dim.dim_value < 0:
                        dim.ClearField("dim_value")
        for n in g.node:
            for a in n.attribute:
                if a.HasField("g"):
                    graph(a.g)
                for sub in a.graphs:
                    graph(sub)

    graph(m.graph)
    return m


def assert_same_proto(original: onnx.ModelProto, exported: onnx.ModelProto) -> None:
    diff = proto_diff(normalized(original), normalized(exported))
    assert not diff, "\n".join(diff)


def assert_bit_identical(expected: dict, got: dict) -> None:
    assert list(expected) == list(got)
    for name, ref in expected.items():
        out = got[name]
        ref, out = np.asarray(ref), np.asarray(out)
        assert ref.dtype == out.dtype and ref.shape == out.shape, name
        nan_ok = ref.dtype.kind in "fc"
        assert np.array_equal(ref, out, equal_nan=nan_ok), f"output '{name}' differs"


def same_bytes(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Equal serialized protos (unlike ``==``, NaN attribute values compare equal)."""
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


def checker_passes(path: str) -> bool:
    try:
        onnx.checker.check_model(path, full_check=True)
        return True
    except Exception:  # checker and shape-inference errors alike
        return False


# -- corpus -------------------------------------------------------------------------------------
def test_corpus_round_trip(corpus_model, tmp_path):
    """export(import(m)) keeps every proto field, passes the checker when m does, and runs
    bit-identically in ONNX Runtime."""
    src = corpus_model.path
    model = load(src)
    out = str(tmp_path / "model.onnx")
    save(model, out)

    original = onnx.load(src)  # external data loaded, as to_onnx embeds it
    assert_same_proto(original, to_onnx(model))
    # The streamed / external-data file parses to the same model as to_onnx, with onnx.load and
    # with passctl's own reader (which splits the weights out of the protobuf).
    assert_same_proto(original, onnx.load(out))
    assert same_bytes(to_onnx(load(out)), to_onnx(model))

    if checker_passes(src):
        onnx.checker.check_model(out, full_check=True)
    inputs = corpus_model.inputs(seed=0)
    assert_bit_identical(run_onnxruntime(src, inputs), run_onnxruntime(out, inputs))


# -- hand-built models --------------------------------------------------------------------------
def _all_attribute_kinds_model() -> onnx.ModelProto:
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [2], [1.5, -2.0])
    typed = helper.make_tensor("typed", TensorProto.INT32, [3], [1, 2, 3])  # int32_data field
    sub = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="inner")], "sub",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("values", TensorProto.FLOAT, [2], [1.0, 2.0]),
        helper.make_tensor("indices", TensorProto.INT64, [2], [0, 3]), [4])
    tp = helper.make_tensor_type_proto(TensorProto.FLOAT16, ["n", 3])
    seq_tp = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.INT64, None))
    node = helper.make_node(
        "Everything", ["a", "", "b"], ["c", ""], name="every", domain="test.domain",
        doc_string="node doc",
        f=0.1, i=-7, s=b"text", s_bytes=b"\xff\xfe", t=tensor, g=sub, st=sparse,
        floats=[0.1, float("nan"), -0.0], ints=[1, 2**40], strings=[b"a", b"\xff"],
        tensors=[tensor, typed], graphs=[sub, sub], sparse_tensors=[sparse])
    node.attribute.append(helper.make_attribute("tp", tp))
    node.attribute.append(helper.make_attribute("tps", [tp, seq_tp]))
    node.attribute.append(helper.make_attribute("empty_ints", [], attr_type=onnx.AttributeProto.INTS))
    node.metadata_props.add(key="k", value="v")
    graph = helper.make_graph(
        [node], "everything",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [None, 2])],
        doc_string="graph doc")
    graph.metadata_props.add(key="graph_key", value="graph_value")
    graph.input[0].doc_string = "input doc"
    graph.input[0].metadata_props.add(key="value_key", value="value_value")
    graph.sparse_initializer.append(sparse)
    graph.quantization_annotation.add(tensor_name="a").quant_parameter_tensor_names.add(
        key="SCALE_TENSOR", value="scale")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("test.domain", 3)],
                              producer_name="test", producer_version="9", doc_string="model doc",
                              domain="org.test", model_version=42)
    model.metadata_props.add(key="model_key", value="model_value")
    model.training_info.add().algorithm.node.add(op_type="Noop")
    return model


def test_every_attribute_kind_and_metadata_round_trip():
    proto = _all_attribute_kinds_model()
    model = from_onnx(proto)
    node = model.graph.nodes[0]
    assert node.inputs[1] is None and node.inputs[0] is model.graph.inputs[0]
    assert node.attributes["s_bytes"].value == b"\xff\xfe" and node.attributes["s"].value == "text"
    assert node.provenance == ("every",)
    assert model.extra["training_info"] and model.graph.extra["sparse_initializer"]
    exported = to_onnx(model)
    # Everything, field by field, no normalization at all.
    assert not proto_diff(proto, exported), proto_diff(proto, exported)
    assert same_bytes(exported, proto)


def _control_flow_model() -> onnx.ModelProto:
    """If, Loop and Scan bodies that read outer-scope values ``w`` and ``x``."""
    f = TensorProto.FLOAT
    then_g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["then_out"])], "then", [],
                               [helper.make_tensor_value_info("then_out", f, [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["else_out"])], "else", [],
                               [helper.make_tensor_value_info("else_out", f, [2])])
    loop_body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_in", "w"], ["acc_out"])], "loop_body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", f, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", f, [2])])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_next"]),
         helper.make_node("Mul", ["row", "w"], ["scan_out"])], "scan_body",
        [helper.make_tensor_value_info("s_in", f, [2]), helper.make_tensor_value_info("row", f, [2])],
        [helper.make_tensor_value_info("s_next", f, [2]),
         helper.make_tensor_value_info("scan_out", f, [2])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["xs"], keepdims=0),
        helper.make_node("Greater", ["xs", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["if_out"], name="if", then_branch=then_g,
                         else_branch=else_g),
        helper.make_node("Loop", ["trip", "", "x"], ["loop_out"], name="loop", body=loop_body),
        helper.make_node("Scan", ["x", "rows"], ["scan_state", "scan_ys"], name="scan",
                         body=scan_body, num_scan_inputs=1),
        helper.make_node("Relu", ["scan_ys"], ["relu_out"]),  # nameless node
    ]
    graph = helper.make_graph(
        nodes, "control_flow",
        [helper.make_tensor_value_info("x", f, [2]), helper.make_tensor_value_info("rows", f, [3, 2])],
        [helper.make_tensor_value_info(n, f, shape) for n, shape in
         (("if_out", [2]), ("loop_out", [2]), ("scan_state", [2]), ("relu_out", [3, 2]))],
        initializer=[helper.make_tensor("w", f, [2], [0.5, -2.0]),
                     helper.make_tensor("zero", f, [], [0.0]),
                     helper.make_tensor("trip", TensorProto.INT64, [], [3])])
    graph.value_info.append(helper.make_tensor_value_info("xs", f, []))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_subgraphs_read_outer_values_and_run_identically():
    proto = _control_flow_model()
    onnx.checker.check_model(proto, full_check=True)
    model = from_onnx(proto)
    w = model.graph.initializers["w"]
    x = model.graph.inputs[0]
    by_name = {n.name: n for n in model.graph}
    then_add = by_name["if"].attributes["then_branch"].value.nodes[0]
    assert then_add.inputs[0] is x and then_add.inputs[1] is w  # the outer Value objects
    loop = by_name["loop"]
    assert loop.inputs[1] is None
    assert loop.attributes["body"].value.nodes[1].inputs[1] is w
    relu = model.graph.nodes[-1]
    assert relu.provenance == ("Relu@5",)
    assert model.graph.nodes[0].outputs[0].shape is not None  # value_info type on the Value

    exported = to_onnx(model)
    assert not proto_diff(proto, exported), proto_diff(proto, exported)
    assert same_bytes(exported, proto)
    onnx.checker.check_model(exported, full_check=True)
    inputs = {"x": np.array([0.3, -1.2], np.float32),
              "rows": np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)}
    assert_bit_identical(run_onnxruntime(proto, inputs), run_onnxruntime(exported, inputs))


def _function_model() -> onnx.ModelProto:
    f = TensorProto.FLOAT
    body = [helper.make_node("Constant", [], ["alpha_t"], value_float=1.0),
            helper.make_node("LeakyRelu", ["X"], ["Y0"]),
            helper.make_node("Mul", ["Y0", "alpha_t"], ["Y"])]
    body[1].attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    fn = helper.make_function("local.fn", "ScaledLeaky", ["X"], ["Y"], body,
                              [helper.make_opsetid("", 18)], attributes=[],
                              doc_string="function doc")
    fn.attribute_proto.append(helper.make_attribute("alpha", 0.25))
    fn.value_info.append(helper.make_tensor_value_info("Y0", f, None))
    fn.metadata_props.add(key="fn_key", value="fn_value")
    call = helper.make_node("ScaledLeaky", ["x"], ["y"], name="call", domain="local.fn", alpha=0.1)
    graph = helper.make_graph([call], "g", [helper.make_tensor_value_info("x", f, [4])],
                              [helper.make_tensor_value_info("y", f, [4])])
    return helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("local.fn", 1)])


def test_model_local_function_round_trip():
    proto = _function_model()
    onnx.checker.check_model(proto, full_check=True)
    model = from_onnx(proto)
    fn = model.functions[("local.fn", "ScaledLeaky", "")]
    leaky = fn.graph.nodes[1]
    assert leaky.attributes["alpha"].ref_attr_name == "alpha"
    assert fn.attribute_defaults[0].value == pytest.approx(0.25)
    exported = to_onnx(model)
    assert not proto_diff(proto, exported), proto_diff(proto, exported)
    assert same_bytes(exported, proto)
    x = {"x": np.array([-2.0, -0.5, 0.0, 3.0], np.float32)}
    assert_bit_identical(run_onnxruntime(proto, x), run_onnxruntime(exported, x))


@pytest.mark.parametrize("dtype", [DataType.INT4, DataType.UINT4, DataType.BFLOAT16,
                                   DataType.FLOAT8E4M3FN, DataType.FLOAT8E5M2,
                                   DataType.FLOAT8E4M3FNUZ, DataType.FLOAT4E2M1])
@pytest.mark.parametrize("raw", [True, False])
def test_narrow_dtype_initializers_bit_exact(dtype, raw, tmp_path):
    rng = np.random.default_rng(int(dtype))
    values = rng.uniform(-6, 6, size=7).astype(dtype.numpy())  # odd count: a half-filled byte
    if raw:
        tensor = onnx.numpy_helper.from_array(values, "w")
        assert tensor.HasField("raw_data")
    else:  # typed fields (int32_data), copied back unchanged
        tensor = helper.make_tensor("w", int(dtype), [7], values, raw=False)
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", int(dtype), [7])],
                              initializer=[tensor])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model = from_onnx(proto)
    got = model.graph.initializers["w"].const.numpy()
    assert got.dtype == dtype.numpy()
    assert np.array_equal(got.view(np.uint8) if got.itemsize == 1 else got.view(np.uint16),
                          values.view(np.uint8) if values.itemsize == 1 else values.view(np.uint16))
    assert same_bytes(to_onnx(model), proto), proto_diff(proto, to_onnx(model))
    path = str(tmp_path / "m.onnx")
    save(model, path)
    assert onnx.load(path) == proto


def test_provenance_metadata_is_read_back_and_written_only_when_it_differs():
    proto = _control_flow_model()
    proto.graph.node[0].metadata_props.add(key="passctl.provenance",
                                           value=json.dumps(["a", "b"]))
    model = from_onnx(proto)
    first, relu = model.graph.nodes[0], model.graph.nodes[-1]
    assert first.provenance == ("a", "b")
    assert "passctl.provenance" not in first.metadata_props
    exported = to_onnx(model)
    assert json.loads(exported.graph.node[0].metadata_props[0].value) == ["a", "b"]
    assert not exported.graph.node[-1].metadata_props  # ("Relu@5",) is the default
    relu.provenance = ("conv1", "bn1")
    relu.name = "fused"
    meta = {p.key: p.value for p in to_onnx(model).graph.node[-1].metadata_props}
    assert json.loads(meta["passctl.provenance"]) == ["conv1", "bn1"]


def test_reader_keeps_large_weights_out_of_the_proto(tmp_path):
    """load() reads each large raw_data (initializers, Constant values) once, into the Tensor; the
    parsed proto never holds it; save() streams it back."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((64, 64)).astype(np.float32)
    small = np.arange(64, dtype=np.float32)  # 256 bytes: stays in the proto
    const = helper.make_node("Constant", [], ["c"], name="const",
                             value=onnx.numpy_helper.from_array(big.T.copy(), "c_value"))
    graph = helper.make_graph([const, helper.make_node("MatMul", ["x", "big"], ["y"], name="mm"),
                               helper.make_node("Add", ["y", "small"], ["y2"], name="add"),
                               helper.make_node("MatMul", ["y2", "c"], ["z"], name="mm2")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 64])],
                              initializer=[onnx.numpy_helper.from_array(big, "big"),
                                           onnx.numpy_helper.from_array(small, "small")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "m.onnx")
    onnx.save(proto, path)
    from passctl.ir.onnx_reader import read_model_file

    skeleton, raws = read_model_file(path)
    # big and the Constant's value are read apart; small (256 bytes) stays in the proto.
    assert raws.tensors == {("init", 0): big.tobytes(), ("node", 0, 0): big.T.tobytes()}
    assert not skeleton.graph.initializer[0].raw_data and skeleton.graph.initializer[1].raw_data
    assert not skeleton.graph.node[0].attribute[0].t.raw_data
    model = load(path)
    assert np.array_equal(model.graph.initializers["big"].const.numpy(), big)
    assert np.array_equal(model.graph.nodes[0].attributes["value"].value.numpy(), big.T)
    assert same_bytes(to_onnx(model), proto)
    out = str(tmp_path / "out.onnx")
    save(model, out)  # streams both the initializer and the Constant value
    assert same_bytes(onnx.load(out), proto)
    x = {"x": rng.standard_normal((1, 64)).astype(np.float32)}
    assert_bit_identical(run_onnxruntime(path, x), run_onnxruntime(out, x))


def test_tensors_built_in_the_ir_export(tmp_path):
    """Tensors made from numpy (strings, bf16, int4) export to the values they hold."""
    from passctl.ir import Graph, Model, Node, Tensor, Value

    strings = np.array([["a", "bé"], ["", "xyz"]], dtype=object)
    bf16 = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
    int4 = np.array([-8, 7, 3], dtype=ml_dtypes.int4)
    graph = Graph(name="built")
    consts = [graph.add_constant(Tensor(strings, dtype=DataType.STRING), "s"),
              graph.add_constant(Tensor(bf16), "bf"), graph.add_constant(Tensor(int4), "i4")]
    outs = []
    for c in consts:
        node = Node("", "Identity", [c], outputs=[Value(c.name + "_out", type=c.type)])
        graph.append(node)
        outs.append(node.outputs[0])
    graph.outputs.extend(outs)
    model = Model(graph, {"": 21})
    path = str(tmp_path / "built.onnx")
    save(model, path)
    for proto in (to_onnx(model), onnx.load(path)):
        onnx.checker.check_model(proto, full_check=True)
        got = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
        assert got["s"].tolist() == strings.tolist()
        assert np.array_equal(got["bf"].view(np.uint16), bf16.view(np.uint16))
        assert np.array_equal(got["i4"].astype(np.int8), int4.astype(np.int8))


def test_subgraph_weights_are_read_apart_and_streamed(tmp_path):
    """Large tensors inside If branches / a Loop body (initializers and Constant values) are read
    once at import and streamed at save, and the model runs identically."""
    rng = np.random.default_rng(5)
    f = TensorProto.FLOAT
    w1 = rng.standard_normal((32, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 32)).astype(np.float32)
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["t_out"], name="then_mm")], "then", [],
        [helper.make_tensor_value_info("t_out", f, [1, 32])],
        initializer=[onnx.numpy_helper.from_array(w1, "w1")])
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["w2"], name="else_const",
                          value=onnx.numpy_helper.from_array(w2, "w2_value")),
         helper.make_node("MatMul", ["x", "w2"], ["e_out"], name="else_mm")], "else", [],
        [helper.make_tensor_value_info("e_out", f, [1, 32])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
         helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
         helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
        "g", [helper.make_tensor_value_info("x", f, [1, 32])],
        [helper.make_tensor_value_info("y", f, [1, 32])],
        initializer=[helper.make_tensor("zero", f, [], [0.0])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path, out = str(tmp_path / "m.onnx"), str(tmp_path / "out.onnx")
    onnx.save(proto, path)
    from passctl.ir.onnx_reader import read_model_file

    _, raws = read_model_file(path)
    # onnx.helper sorts attributes by name: else_branch is attribute 0, then_branch 1.
    assert raws.tensors == {("node", 2, 1, "init", 0): w1.tobytes(),
                            ("node", 2, 0, "node", 0, 0): w2.tobytes()}
    model = load(path)
    save(model, out)
    assert same_bytes(onnx.load(out), proto)
    for x in (np.abs(rng.standard_normal((1, 32))), -np.abs(rng.standard_normal((1, 32)))):
        feed = {"x": x.astype(np.float32)}
        assert_bit_identical(run_onnxruntime(path, feed), run_onnxruntime(out, feed))


def test_raw_data_that_disagrees_with_the_shape_is_kept_as_is(tmp_path):
    """A broken tensor (1000 raw bytes for 300 floats) is written back byte for byte, and the
    streamed lengths stay right for the fields after it."""
    bad = TensorProto(name="bad", data_type=TensorProto.FLOAT, dims=[300], raw_data=b"\x01" * 1000)
    good = onnx.numpy_helper.from_array(np.arange(400, dtype=np.float32), "good")
    graph = helper.make_graph([helper.make_node("Identity", ["good"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [400])],
                              initializer=[bad, good])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path, out, ext = (str(tmp_path / n) for n in ("m.onnx", "out.onnx", "ext.onnx"))
    onnx.save(proto, path)
    model = load(path)
    save(model, out)
    assert same_bytes(onnx.load(out), proto)
    save(model, ext, external_data=True)
    assert not proto_diff(proto, onnx.load(ext))  # onnx.load marks data_location=DEFAULT set


def test_from_onnx_leaves_the_proto_unchanged():
    proto = _control_flow_model()
    before = proto.SerializeToString(deterministic=True)
    model = from_onnx(proto)
    to_onnx(model)
    assert proto.SerializeToString(deterministic=True) == before


def test_initializer_that_is_also_an_input_stays_both():
    proto = _control_flow_model()
    proto.ir_version = 3
    proto.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]))
    model = from_onnx(proto)
    w = model.graph.initializers["w"]
    assert w.is_graph_input() and w.is_initializer() and model.graph.inputs[-1] is w
    assert same_bytes(to_onnx(model), proto), proto_diff(proto, to_onnx(model))


@pytest.mark.parametrize("dtype", [DataType.INT4, DataType.UINT4])
@pytest.mark.parametrize("external", [False, True])
def test_spilled_4bit_constants_are_packed_like_onnx(dtype, external, tmp_path):
    """A 4-bit array spilled (quantize-weights' int4 codes of external weights) reads back as
    itself and is written as onnx packs it (onnx.numpy_helper reads the saved model: inline or as
    external data copied byte for byte from the spill file)."""
    from passctl.ir import spill

    rng = np.random.default_rng(int(dtype))
    lo, hi = (-8, 8) if dtype == DataType.INT4 else (0, 16)
    values = rng.integers(lo, hi, (65, 41)).astype(dtype.numpy())  # odd count: a half byte;
    tensor = spill(values)  # 1333 bytes packed: above save's 1 KiB inline floor
    assert tensor.external is not None and tensor.external.length == 1333
    assert np.array_equal(tensor.numpy().astype(np.int8), values.astype(np.int8))
    placeholder = helper.make_tensor("w", int(dtype), [65, 41], [0] * (65 * 41))
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", int(dtype), [65, 41])],
                              initializer=[placeholder])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    w = model.graph.initializers["w"]
    tensor.name = "w"
    w.const = tensor
    path = str(tmp_path / "m.onnx")
    save(model, path, external_data=external, size_threshold=0)
    proto = onnx.load(path, load_external_data=False)
    (init,) = [t for t in proto.graph.initializer if t.name == w.name]
    assert (init.data_location == TensorProto.EXTERNAL) == external
    got = onnx.numpy_helper.to_array(init, base_dir=str(tmp_path))
    assert np.array_equal(got.astype(np.int8), values.astype(np.int8))
