"""Property tests of the IR text form: any bytes of any element type, any names and strings."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from passctl.ir import (Attr, AttrType, DataType, Graph, Model, Node, Shape, Tensor, TensorType,
                        Value, parse_model, print_model, structural_diff)
from passctl.ir.equality import tensors_equal

NUMERIC = [dt for dt in DataType if dt not in (DataType.UNDEFINED, DataType.STRING)]
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def raw_tensors(draw):
    dt = draw(st.sampled_from(NUMERIC))
    dims = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    count = int(np.prod(dims, dtype=np.int64))
    data = draw(st.binary(min_size=(count * dt.bitwidth + 7) // 8,
                          max_size=(count * dt.bitwidth + 7) // 8))
    return Tensor(data, dtype=dt, dims=dims)


def _model(graph: Graph) -> Model:
    return Model(graph, {"": 21})


@SETTINGS
@given(raw_tensors(), st.sampled_from([0, 4, 64]))
def test_any_tensor_bytes_read_back_exactly(tensor, inline_limit):
    """Inline values (dense when exact, hex otherwise) read back to the same elements."""
    v = Value("t", const=tensor)
    g = Graph(name="g")
    g.add_initializer(v)
    g.outputs.append(v)
    text = print_model(_model(g), inline_limit=inline_limit)
    back = parse_model(text).graph.initializers["t"].const
    assert (back.dtype, back.dims) == (tensor.dtype, tensor.dims)
    assert tensors_equal(back, tensor), text


_names = st.text(min_size=0, max_size=12)
_texts = st.one_of(st.text(max_size=20), st.binary(max_size=12))


@SETTINGS
@given(st.lists(_names, min_size=1, max_size=4), _texts, st.text(max_size=20), _names,
       st.lists(st.one_of(st.integers(0, 9), _names.filter(bool), st.none()), max_size=3))
def test_any_names_and_strings_round_trip(names, attr_value, doc, op, dims):
    """Value, node, op and dim names and string attributes may hold any characters."""
    x = Value(names[0], TensorType(DataType.FLOAT, Shape(tuple(dims))))
    g = Graph([x], name=names[-1])
    prev = x
    for i, name in enumerate(names[1:]):
        out = Value(name)
        g.append(Node("", op or "Op", [prev], [Attr("s", AttrType.STRING, attr_value)],
                      outputs=[out], name=name, doc_string=doc, provenance=(name, doc)))
        prev = out
    g.outputs.append(prev)
    model = _model(g)
    model.metadata_props = {doc: attr_value if isinstance(attr_value, str) else "x"}
    text = print_model(model)
    back = parse_model(text)
    assert structural_diff(model, back) is None, text
    assert print_model(back) == text
