"""Hand-built IR models for the text-form tests: every attribute kind, element and value type."""

from __future__ import annotations

import math

import numpy as np
import onnx

from passctl.ir import (Attr, AttrType, DataType, Function, Graph, MapType, Model, Node,
                        OptionalType, SequenceType, Shape, SparseTensorType, Tensor, TensorType,
                        Value)

# Every element type a Tensor can hold (UNDEFINED has no data).
ELEMENT_TYPES = [dt for dt in DataType if dt != DataType.UNDEFINED]

# Values every float type represents exactly (e8m0 holds only positive powers of two).
NICE_FLOATS = {"default": [0.5, -2.0, 0.25], DataType.FLOAT8E8M0: [0.5, 2.0, 0.25]}


def nice_tensor(dt: DataType) -> Tensor:
    """Three exact, readable elements of ``dt`` (the text form prints them as ``dense<...>``)."""
    if dt == DataType.STRING:
        arr = np.array([b"plain", "caf\u00e9".encode(), b"\xff\x00\"q\"\n"], dtype=object)
    elif dt == DataType.BOOL:
        arr = np.array([True, False, True])
    elif dt in (DataType.COMPLEX64, DataType.COMPLEX128):
        arr = np.array([1 + 2j, -0.5j, 3], dtype=dt.numpy())
    elif dt.is_floating:
        arr = np.array(NICE_FLOATS.get(dt, NICE_FLOATS["default"]), np.float32).astype(dt.numpy())
    elif dt in (DataType.INT4, DataType.INT2):
        arr = np.array([-2, 1, 0], dtype=dt.numpy())
    elif dt in (DataType.UINT4, DataType.UINT2):
        arr = np.array([3, 1, 0], dtype=dt.numpy())
    else:
        info = np.iinfo(dt.numpy())
        arr = np.array([info.min, info.max, 7], dtype=dt.numpy())
    return Tensor(arr, dtype=dt)


def raw_tensor(dt: DataType, count: int, seed: int) -> Tensor:
    """``count`` elements of random raw bytes (odd NaN payloads, bools that are neither 0 nor 1)."""
    rng = np.random.default_rng(seed)
    nbytes = (count * dt.bitwidth + 7) // 8
    return Tensor(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes(), dtype=dt, dims=(count,))


def _sparse() -> onnx.SparseTensorProto:
    sp = onnx.SparseTensorProto()
    sp.dims.extend([4, 4])
    sp.values.CopyFrom(onnx.numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "vals"))
    sp.indices.CopyFrom(onnx.numpy_helper.from_array(np.array([1, 14], np.int64), "idx"))
    return sp


def _branch(name: str, outer: Value, op: str) -> Graph:
    """A subgraph reading the outer value ``outer`` and holding its own initializer."""
    g = Graph(name=name)
    c = g.add_constant(np.array([3.0], np.float32), name + "_c")
    n = Node("", op, [outer, c], outputs=[Value(name + "_out", TensorType(DataType.FLOAT))],
             name=name + "_node")
    g.append(n)
    g.outputs.append(n.outputs[0])
    return g


def every_kind_model() -> Model:
    """A model using every text-form feature (it need not run; it must round-trip)."""
    f32 = DataType.FLOAT
    x = Value("x", TensorType(f32, Shape(("N", 3))), doc_string="the input")
    x.metadata_props = {"unit": "volt"}
    odd = Value("a b:c\"d", TensorType(f32, Shape((None, 3))))
    w_in = Value("w_in", const=Tensor(np.array([1.0, 2.0, 3.0], np.float32), name="w_in"))
    den = Value("den", TensorType(f32, Shape(("N", 3), ("DATA_BATCH", "")), denotation="IMAGE"))
    others = [Value("seq", SequenceType(TensorType(f32))), Value("opt", OptionalType(
        TensorType(DataType.INT64, Shape(())))), Value("map", MapType(DataType.STRING,
        TensorType(f32, Shape((None,))))), Value("sp", SparseTensorType(f32, Shape((4, 4)))),
        Value("unk", None), Value("seq_unk", SequenceType(None)), Value("kw_dims", TensorType(
            DataType.BFLOAT16, Shape(("nan", "2*s0", 0))))]
    g = Graph([x, odd, den] + others, name="main", doc_string="main graph doc")
    g.add_input(w_in)
    g.add_initializer(w_in)
    g.metadata_props = {"graph": "meta"}
    g.extra = {"quantization_annotation": [b"\x0a\x03abc"]}
    inits = []
    for i, dt in enumerate(ELEMENT_TYPES):
        inits.append(g.add_initializer(Value(f"c_{dt.short_name}", const=nice_tensor(dt))))
        if dt not in (DataType.STRING,):
            big = g.add_initializer(Value(f"r_{dt.short_name}", const=raw_tensor(dt, 19, i)))
            inits.append(big)
    unused = g.add_initializer(Value("unused", const=Tensor(np.arange(4, dtype=np.int64))))
    unused.doc_string = "never read"

    a = Value("a", TensorType(f32, Shape(("N", 3))))
    g.append(Node("", "Add", [x, w_in], outputs=[a], name="add0"))
    # A value without a name, and two values with the same name: the printer makes them unique.
    nameless = Value("", TensorType(f32, Shape(("N", 3))))
    g.append(Node("", "Relu", [a], outputs=[nameless], provenance=("relu-src",)))
    dup1, dup2 = Value("dup"), Value("dup")
    g.append(Node("", "Neg", [nameless], outputs=[dup1], name="neg", provenance=()))
    g.append(Node("", "Abs", [dup1], outputs=[dup2]))
    g.append(Node("", "Concat", inits[:6], {"axis": 0}, outputs=[Value("cat")], name="cat"))

    attrs = [
        Attr("f", AttrType.FLOAT, float(np.float32(0.1))),
        Attr("f_nan", AttrType.FLOAT, math.nan), Attr("f_inf", AttrType.FLOAT, -math.inf),
        Attr("f_tiny", AttrType.FLOAT, float(np.float32(1e-45))),
        Attr("i", AttrType.INT, -7), Attr("i_big", AttrType.INT, 2 ** 62),
        Attr("s", AttrType.STRING, "h\u00e9llo \"q\"\n\t\\", doc_string="a string attribute"),
        Attr("s_bytes", AttrType.STRING, b"\xff\xfe raw"),
        Attr("t", AttrType.TENSOR, Tensor(np.array([[1, 2], [3, 4]], np.float32), name="tt",
                                          doc_string="tensor doc", metadata_props={"k": "v"})),
        Attr("t_big", AttrType.TENSOR, raw_tensor(DataType.FLOAT, 40, 99)),
        Attr("g", AttrType.GRAPH, _branch("sub", x, "Mul")),
        Attr("sparse", AttrType.SPARSE_TENSOR, _sparse()),
        Attr("tp", AttrType.TYPE_PROTO, TensorType(DataType.FLOAT16, Shape(("B", None)))),
        Attr("floats", AttrType.FLOATS, (1.0, -0.5, float(np.float32(3.3)))),
        Attr("ints", AttrType.INTS, (1, -2, 3)),
        Attr("strings", AttrType.STRINGS, ("a", b"\xff", "")),
        Attr("tensors", AttrType.TENSORS, (nice_tensor(DataType.INT8), nice_tensor(DataType.BOOL))),
        Attr("graphs", AttrType.GRAPHS, (_branch("g1", a, "Add"), _branch("g2", x, "Sub"))),
        Attr("sparse_tensors", AttrType.SPARSE_TENSORS, (_sparse(),)),
        Attr("type_protos", AttrType.TYPE_PROTOS, (SequenceType(TensorType(f32)),
                                                    MapType(DataType.INT64, None))),
        Attr("no_ints", AttrType.INTS, ()), Attr("no_floats", AttrType.FLOATS, ()),
        Attr("no_graphs", AttrType.GRAPHS, ()), Attr("weird-attr name", AttrType.INT, 1),
    ]
    e1 = Value("e1", TensorType(f32, Shape(("N", 3))), doc_string="first output")
    e1.metadata_props = {"m": "1"}
    every = Node("test.domain", "Everything", [a, None, odd, None], attrs,
                 outputs=[e1, Value(""), Value("e3")], name="every",
                 doc_string="node doc", provenance=("p1", "p2"),
                 metadata_props={"note": "multi\nline"})
    g.append(every)
    g.append(Node("test.domain", "Sink", [e1], outputs=[]))  # a node with no outputs
    g.append(Node("", "init", [e1], outputs=[Value("kw_op")], name="keyword-named op"))
    call = Node("com.example", "MyFn", [a], {"alpha": 0.5}, outputs=[Value("fn_out")],
                overload="v2", name="call")
    g.append(call)
    g.outputs.extend([e1, call.outputs[0], dup2, a])

    body = Graph([Value("fx")], name="body_graph")  # a function body has no name in ONNX
    fy = Value("fy")
    body.append(Node("", "LeakyRelu", [body.inputs[0]],
                     [Attr("alpha", AttrType.FLOAT, None, ref_attr_name="alpha")],
                     outputs=[fy]))
    fz = Value("fz")
    body.append(Node("", "Mul", [fy, fy], outputs=[fz]))
    body.outputs.append(fz)
    fn = Function("com.example", "MyFn", body, {"": 21}, attributes=["alpha"],
                  attribute_defaults=[Attr("beta", AttrType.INT, 2)], overload="v2",
                  doc_string="function doc")
    fn.metadata_props = {"fn": "meta"}

    m = Model(g, {"": 21, "test.domain": 1, "com.example": 1}, ir_version=10,
              producer_name="hand", producer_version="1.0", domain="org.test", model_version=3,
              doc_string="model doc", functions=[fn])
    m.metadata_props = {"author": "tests", "": "empty key"}
    m.extra = {"training_info": [b"\x00\x01binary"]}
    return m


def small_mlp() -> Model:
    """x: f32[N,4] -> MatMul(w: f32[4,2]) -> Add(b) -> Relu -> y (the golden-text model)."""
    f32 = DataType.FLOAT
    x = Value("x", TensorType(f32, Shape(("N", 4))))
    g = Graph([x], name="mlp")
    w = g.add_initializer(Value("w", const=Tensor(
        np.array([[0.5, -1.0], [0.25, 2.0], [1e-05, 3.0], [-0.125, 0.0]], np.float32))))
    b = g.add_initializer(Value("b", const=Tensor(np.array([0.1, -0.1], np.float32))))
    h = Value("h", TensorType(f32, Shape(("N", 2))))
    g.append(Node("", "MatMul", [x, w], outputs=[h], name="/fc/MatMul",
                  provenance=("/fc/MatMul",)))
    hb = Value("hb", TensorType(f32, Shape(("N", 2))))
    g.append(Node("", "Add", [h, b], outputs=[hb], name="/fc/Add", provenance=("/fc/Add",)))
    y = Value("y", TensorType(f32, Shape(("N", 2))))
    g.append(Node("", "Relu", [hb], outputs=[y], name="/act/Relu",
                  provenance=("/act/Relu", "/fc/Clip")))
    g.outputs.append(y)
    return Model(g, {"": 17}, ir_version=8, producer_name="pytorch", producer_version="2.14.1")


def ort_model() -> onnx.ModelProto:
    """A runnable ONNX model with small and large weights, an If with outer reads, and Split."""
    h = onnx.helper
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    then_g = h.make_graph([h.make_node("Relu", ["mm"], ["t_out"])], "then", [],
                          [h.make_tensor_value_info("t_out", onnx.TensorProto.FLOAT, None)])
    else_g = h.make_graph([h.make_node("Neg", ["mm"], ["e_out"])], "else", [],
                          [h.make_tensor_value_info("e_out", onnx.TensorProto.FLOAT, None)])
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["mm0"], name="mm"),
        h.make_node("Add", ["mm0", "bias"], ["mm"], name="add"),
        h.make_node("ReduceSum", ["mm"], ["s"], keepdims=0, name="sum"),
        h.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
        h.make_node("If", ["c"], ["branch"], then_branch=then_g, else_branch=else_g, name="if"),
        h.make_node("Split", ["branch"], ["p", "q"], axis=1, num_outputs=2, name="split"),
        h.make_node("LeakyRelu", ["q"], ["y"], alpha=0.01, name="lrelu"),
    ]
    graph = h.make_graph(
        nodes, "ort", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
        [h.make_tensor_value_info("p", onnx.TensorProto.FLOAT, ["N", 8]),
         h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 8])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(bias, "bias"),
         onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=9)


__all__ = ["ELEMENT_TYPES", "every_kind_model", "nice_tensor", "ort_model", "raw_tensor",
           "small_mlp"]
