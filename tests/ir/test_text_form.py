"""The IR text form: print/parse round trips, golden text, parse errors, equality, ORT, corpus."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from corpus import CORPUS
from passctl.ir import (AttrType, DataType, Shape, Tensor, TensorType, assert_structurally_equal,
                        format_node, from_onnx, load, parse_file, parse_graph, parse_model,
                        print_graph, print_model, save, structural_diff)
from passctl.ir.errors import ParseError, UserError
from passctl.support.check import run_onnxruntime
from text_form_models import ELEMENT_TYPES, every_kind_model, ort_model, small_mlp

# The golden text of text_form_models.small_mlp(), written by hand from the grammar in
# docs/ir-text-form.md: a node whose provenance is just its own name shows no loc(...).
GOLDEN_MLP = """\
model ir_version 8 opset {"": 17} producer "pytorch" "2.14.1" {
  graph @mlp(%x: f32[N,4]) -> (f32[N,2]) {
    %w = init f32[4,2] dense<0.5, -1.0, 0.25, 2.0, 1e-05, 3.0, -0.125, 0.0>
    %b = init f32[2] dense<0.1, -0.1>
    %h: f32[N,2] = MatMul(%x, %w) name "/fc/MatMul"
    %hb: f32[N,2] = Add(%h, %b) name "/fc/Add"
    %y: f32[N,2] = Relu(%hb) name "/act/Relu" loc("/act/Relu", "/fc/Clip")
    return %y
  }
}
"""


def round_trip(model):
    text = print_model(model)
    back = parse_model(text)
    return text, back


# -- round trips ---------------------------------------------------------------------------------

def test_every_kind_round_trips_structurally_equal():
    model = every_kind_model()
    text, back = round_trip(model)
    assert structural_diff(model, back) is None
    assert print_model(back) == text


def test_every_element_type_prints_exact_values_and_reads_back():
    model = every_kind_model()
    text, back = round_trip(model)
    for dt in ELEMENT_TYPES:
        original = model.graph.initializers[f"c_{dt.short_name}"].const
        parsed = back.graph.initializers[f"c_{dt.short_name}"].const
        assert parsed.dtype == dt and parsed.dims == (3,)
        if dt == DataType.STRING:
            assert list(parsed.numpy()) == [b"plain", "caf\u00e9".encode(), b"\xff\x00\"q\"\n"]
        else:
            assert parsed.numpy().tobytes() == original.numpy().tobytes(), dt
        if dt.is_floating:  # readable values, not hex
            assert f"%c_{dt.short_name} = init {dt.short_name}[3] dense<0.5, " in text
        raw = model.graph.initializers.get(f"r_{dt.short_name}")
        if raw is not None:  # random bytes: NaN payloads, bools that are neither 0 nor 1
            got = back.graph.initializers[f"r_{dt.short_name}"].const
            assert got.numpy().tobytes() == raw.const.numpy().tobytes(), dt


def test_attribute_kinds_keep_their_values():
    _, back = round_trip(every_kind_model())
    every = next(n for n in back.graph if n.op_type == "Everything")
    a = every.attributes
    assert {k: a[k].type for k in ("f", "i", "s", "t", "g", "sparse", "tp", "floats", "ints",
                                   "strings", "tensors", "graphs", "sparse_tensors",
                                   "type_protos", "no_ints", "no_floats", "no_graphs")} == {
        "f": AttrType.FLOAT, "i": AttrType.INT, "s": AttrType.STRING, "t": AttrType.TENSOR,
        "g": AttrType.GRAPH, "sparse": AttrType.SPARSE_TENSOR, "tp": AttrType.TYPE_PROTO,
        "floats": AttrType.FLOATS, "ints": AttrType.INTS, "strings": AttrType.STRINGS,
        "tensors": AttrType.TENSORS, "graphs": AttrType.GRAPHS,
        "sparse_tensors": AttrType.SPARSE_TENSORS, "type_protos": AttrType.TYPE_PROTOS,
        "no_ints": AttrType.INTS, "no_floats": AttrType.FLOATS, "no_graphs": AttrType.GRAPHS}
    assert np.float32(a["f"].value) == np.float32(0.1)
    assert math.isnan(a["f_nan"].value) and a["f_inf"].value == -math.inf
    assert a["f_tiny"].value == float(np.float32(1e-45)) > 0
    assert a["i_big"].value == 2 ** 62
    assert a["s"].value == "h\u00e9llo \"q\"\n\t\\" and a["s"].doc_string == "a string attribute"
    assert a["s_bytes"].value == b"\xff\xfe raw"
    assert a["strings"].value == ("a", b"\xff", "")
    assert a["tp"].value == TensorType(DataType.FLOAT16, Shape(("B", None)))
    assert a["t"].value.numpy().tolist() == [[1, 2], [3, 4]] and a["t"].value.name == "tt"
    sub = a["g"].value
    mul = next(iter(sub))
    assert mul.inputs[0] is back.graph.inputs[0]  # the subgraph reads the outer %x
    fn = next(iter(back.functions.values()))
    alpha = next(iter(fn.graph)).attributes["alpha"]
    assert alpha.ref_attr_name == "alpha" and alpha.type == AttrType.FLOAT


def test_names_types_and_omitted_values():
    text, back = round_trip(every_kind_model())
    assert '%"a b:c\\"d": f32[?,3]' in text
    assert "%den: f32[N denote \"DATA_BATCH\",3] denote \"IMAGE\"" in text
    assert '%kw_dims: bf16["nan","2*s0",0]' in text
    assert "%w_in: f32[3] = init f32[3] dense<1.0, 2.0, 3.0>" in text
    g = back.graph
    names = [v.name for v in g.inputs]
    assert names[1] == 'a b:c"d'
    assert g.initializers["w_in"] is g.inputs[-1]  # an initializer that is also an input
    every = next(n for n in g if n.op_type == "Everything")
    assert every.inputs[1] is None and every.inputs[3] is None and len(every.inputs) == 4
    assert every.outputs[1].name == "" and not every.outputs[1].uses()
    sink = next(n for n in g if n.op_type == "Sink")
    assert sink.outputs == () and sink.domain == "test.domain"
    # the nameless value and the second "dup" got fresh, distinct printed names
    assert len({n.outputs[0].name for n in g if n.op_type in ("Relu", "Neg", "Abs")}) == 3


def test_parse_graph_reads_print_graph():
    g = small_mlp().graph
    back = parse_graph(print_graph(g))
    assert structural_diff(g, back) is None


# -- determinism and golden text -----------------------------------------------------------------

def test_printing_is_deterministic(tmp_path):
    assert print_model(every_kind_model()) == print_model(every_kind_model())
    model = from_onnx(ort_model())
    w1, w2 = str(tmp_path / "a.bin"), str(tmp_path / "b.bin")
    t1 = print_model(model, weights_path=w1, inline_limit=4)
    t2 = print_model(model, weights_path=w2, inline_limit=4)
    assert t1.replace("a.bin", "b.bin") == t2
    assert open(w1, "rb").read() == open(w2, "rb").read()


def test_golden_text_of_a_small_model():
    assert print_model(small_mlp()) == GOLDEN_MLP
    assert structural_diff(parse_model(GOLDEN_MLP), small_mlp()) is None


def test_line_map_points_at_each_node():
    model = every_kind_model()
    line_map = {}
    lines = print_model(model, line_map=line_map).splitlines()
    nodes = list(model.graph.all_nodes()) + [
        n for fn in model.functions.values() for n in fn.graph.all_nodes()]
    assert set(line_map) == set(nodes)
    for node in nodes:
        line = lines[line_map[node] - 1].strip()
        if node.subgraphs():
            assert line.startswith(format_node(node).split(" {")[0])
        elif node.outputs and node.outputs[0].name in ("", "dup"):
            continue  # renamed for printing; format_node shows the value's own name
        else:
            assert line == format_node(node)


# -- structural equality is not vacuous ----------------------------------------------------------

def _node(model, op):
    return next(n for n in model.graph.all_nodes() if n.op_type == op)


MUTATIONS = {
    "float attribute by one ulp": (
        lambda m: setattr(_node(m, "Everything").attributes["f"], "value",
                          float(np.nextafter(np.float32(0.1), np.float32(1)))),
        "node 5 (test.domain::Everything) attribute 'f': value"),
    "initializer byte": (
        lambda m: m.graph.initializers.__setitem__("r_u8", _with_byte_flipped(m, "r_u8")),
        "tensor data differs"),
    "op type": (lambda m: setattr(_node(m, "Abs"), "op_type", "Exp"), "node 3 (Abs vs Exp)"),
    "value type": (
        lambda m: setattr(_node(m, "Add").outputs[0], "type",
                                TensorType(DataType.FLOAT, Shape(("N", 4)))),
        "node 0 (Add) output 0: type (f32[N,3] vs f32[N,4])"),
    "provenance": (lambda m: setattr(_node(m, "Relu"), "provenance", ("other",)),
                   "provenance"),
    "input order": (lambda m: _swap_inputs(_node(m, "Add")), "node 0 (Add) input 0"),
    "subgraph node": (lambda m: setattr(_node(m, "Mul"), "op_type", "Div"),
                      "graph 'sub': node 0 (Mul vs Div)"),
    "opset": (lambda m: m.opset_imports.__setitem__("", 20), "opset_imports"),
    "metadata": (lambda m: m.graph.metadata_props.__setitem__("graph", "x"),
                 "metadata_props"),
}


def _with_byte_flipped(m, name):
    v = m.graph.initializers[name]
    raw = bytearray(v.const.tobytes())
    raw[3] ^= 1
    v.const = Tensor(bytes(raw), dtype=v.const.dtype, dims=v.const.dims)
    return v


def _swap_inputs(node):
    a, b = node.inputs
    node.set_inputs([b, a])


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_structural_diff_reports_the_first_difference(case):
    mutate, expected = MUTATIONS[case]
    original = every_kind_model()
    _, changed = round_trip(original)
    mutate(changed)
    diff = structural_diff(original, changed)
    assert diff is not None and expected in diff, diff
    with pytest.raises(AssertionError, match="models differ"):
        assert_structurally_equal(original, changed)


def test_node_names_are_compared_unless_asked_not_to():
    original = small_mlp()
    changed = parse_model(GOLDEN_MLP.replace('name "/fc/Add"', 'name "/fc/Add_2" loc("/fc/Add")'))
    assert "node name" in structural_diff(original, changed)
    assert structural_diff(original, changed, node_names=False) is None


# -- parse errors ----------------------------------------------------------------------------------

def _position(text: str, needle: str, occurrence: int = 0) -> str:
    index = -1
    for _ in range(occurrence + 1):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index) + 1
    return f"{line}:{index - text.rfind(chr(10), 0, index)}"


PARSE_ERRORS = [
    ("undefined value", ("MatMul(%x, %w)", "MatMul(%x, %nope)"), "%nope",
     "value '%nope' is not defined before this use"),
    ("unknown element type", ("%x: f32[N,4]", "%x: f33[N,4]"), "f33",
     "unknown element type 'f33'"),
    ("element count", ("dense<0.1, -0.1>", "dense<0.1>"), "dense<0.1>",
     "f32[2] needs 2 elements, found 1"),
    ("missing parenthesis", ("MatMul(%x, %w)", "MatMul(%x, %w"), 'name "/fc/MatMul"',
     "expected ',' or ')', found name 'name'"),
    ("unterminated string", ('name "/fc/Add"', 'name "/fc/Add'), '"/fc/Add',
     "unterminated string"),
    ("output type", ("-> (f32[N,2])", "-> (f32[N,3])"), "%y\n",
     "output '%y' has type f32[N,2] but the signature says f32[N,3]"),
    ("missing weights file", ("dense<0.1, -0.1>", '@raw("nowhere.bin", 0, 8)'), "@raw",
     "f32[2]: file 'nowhere.bin' not found"),
    ("redefinition", ("%hb: f32[N,2] = Add", "%h: f32[N,2] = Add"), "%h: f32[N,2]",
     "value '%h' is defined twice"),
    ("empty list kind", ("MatMul(%x, %w)", "MatMul(%x, %w) {perm = []}"), "[]",
     "the kind of an empty list is unknown; write e.g. '[] : ints'"),
    ("bad escape", ('"/act/Relu" loc', '"/act\\q" loc'), '\\q', "bad escape '\\q'"),
    ("value type", ("%x: f32[N,4]", "%x: f32[N,4"), ")", "expected ',' or ']', found ')'"),
]


@pytest.mark.parametrize("case", PARSE_ERRORS, ids=[c[0] for c in PARSE_ERRORS])
def test_parse_errors_give_file_line_column_and_expectation(case):
    _, (old, new), at, message = case
    assert old in GOLDEN_MLP
    text = GOLDEN_MLP.replace(old, new, 1)
    expected_pos = _position(text, at, 1 if case[0] == "redefinition" else 0)
    with pytest.raises(ParseError) as info:
        parse_model(text, "model.pir")
    err = info.value
    assert isinstance(err, UserError)
    assert str(err).startswith(f"model.pir:{expected_pos}: "), str(err)
    assert message in str(err), str(err)


def test_use_before_definition_is_an_error():
    lines = GOLDEN_MLP.splitlines(keepends=True)
    swapped = "".join(lines[:4] + [lines[5], lines[4]] + lines[6:])  # Add before MatMul
    with pytest.raises(ParseError, match=r"^<string>:5:\d+: value '%h' is not defined"):
        parse_model(swapped)


def test_parse_file_names_the_file(tmp_path):
    path = tmp_path / "bad.pir"
    path.write_text(GOLDEN_MLP.replace("Relu(%hb)", "Relu(%hb"))
    with pytest.raises(ParseError) as info:
        parse_file(str(path))
    assert (info.value.filename, info.value.line) == (str(path), 7)
    assert str(info.value).startswith(f"{path}:7:")


def test_a_model_needs_a_graph():
    with pytest.raises(ParseError, match="has no main graph"):
        parse_model('model ir_version 8 opset {"": 17} {\n}\n')


# -- weights files, references, ONNX Runtime -----------------------------------------------------

def _run_both(proto, back_model, tmp_path, inputs):
    path = str(tmp_path / "back.onnx")
    save(back_model, path)
    ref = run_onnxruntime(proto if not isinstance(proto, str) else proto, inputs)
    got = run_onnxruntime(path, inputs)
    assert list(ref) == list(got)
    for name in ref:
        assert np.asarray(ref[name]).tobytes() == np.asarray(got[name]).tobytes(), name


def test_parsed_graph_exports_and_runs_bit_identical_in_onnxruntime(tmp_path):
    proto = ort_model()
    model = from_onnx(proto)
    text = print_model(model, weights_path=str(tmp_path / "m.bin"), inline_limit=4)
    assert '@raw("m.bin", 0, 512)' in text  # the 8x16 weight went to the weights file
    (tmp_path / "m.pir").write_text(text)
    back = parse_file(str(tmp_path / "m.pir"))
    assert_structurally_equal(model, back)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    _run_both(proto, back, tmp_path, {"x": x})
    _run_both(proto, back, tmp_path, {"x": -x})  # the other If branch


def test_reprinting_onto_the_weights_file_it_reads_from(tmp_path):
    model = from_onnx(ort_model())
    weights, text_path = str(tmp_path / "m.bin"), str(tmp_path / "m.pir")
    with open(text_path, "w") as f:
        f.write(print_model(model, weights_path=weights, inline_limit=4))
    back = parse_file(text_path)  # memory-maps m.bin
    with open(text_path, "w") as f:
        f.write(print_model(back, weights_path=weights, inline_limit=4))  # replaces m.bin
    assert_structurally_equal(model, parse_file(text_path))


@pytest.mark.parametrize("model_id", ["ppocr_cls", "silero_vad"])
def test_corpus_model_through_text_runs_bit_identical(model_id, tmp_path):
    cm = CORPUS[model_id]
    model = load(cm.path)
    model.source_path = None if model_id == "silero_vad" else model.source_path
    text_path = tmp_path / "m.pir"
    text_path.write_text(print_model(model, weights_path=str(tmp_path / "m.bin")))
    back = parse_file(str(text_path))
    _run_both(cm.path, back, tmp_path, cm.inputs(seed=0))


def test_unchanged_weights_refer_to_the_source_model(tmp_path):
    path = CORPUS["ppocr_cls"].path
    model = load(path)
    text = print_model(model)
    assert f'@onnx("{path}", tensor ' in text and 'hex<"' not in text
    # A changed constant must not be referenced in the source file: its own bytes are printed.
    node = next(n for n in model.graph if n.op_type == "Constant" and
                n.attributes["value"].value.size > 16)
    old = node.attributes["value"].value
    new = Tensor(old.numpy() * 2, dtype=old.dtype, name=old.name)
    node.attributes["value"].value = new
    text = print_model(model, weights_path=str(tmp_path / "w.bin"))
    assert text.count("@raw(") == 1
    back = parse_model(text, str(tmp_path / "m.pir"))
    assert_structurally_equal(model, back)
    got = next(n for n in back.graph if n.name == node.name) if node.name else None
    if got is not None:
        assert np.array_equal(got.attributes["value"].value.numpy(), old.numpy() * 2)


def test_corpus_round_trip(corpus_model, tmp_path):
    model = load(corpus_model.path)
    text = print_model(model)
    back = parse_model(text)
    assert_structurally_equal(model, back)
    assert print_model(back) == text
    # Again through a weights file, without references to the source model.
    model.source_path = None
    text_path = tmp_path / "m.pir"
    text_path.write_text(print_model(model, weights_path=str(tmp_path / "m.bin")))
    assert '@onnx(' not in text_path.read_text()
    assert_structurally_equal(model, parse_file(str(text_path)))


def test_weights_paths_are_relative_to_the_text(tmp_path):
    sub = tmp_path / "weights"
    sub.mkdir()
    model = from_onnx(ort_model())
    text = print_model(model, weights_path=str(sub / "w.bin"), inline_limit=4,
                       text_dir=str(tmp_path))
    assert '@raw("weights/w.bin", ' in text
    (tmp_path / "m.pir").write_text(text)
    assert_structurally_equal(model, parse_file(str(tmp_path / "m.pir")))
    assert os.path.getsize(sub / "w.bin") >= 512


def test_the_sample_in_the_docs_parses_and_prints_as_shown():
    doc_path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "ir-text-form.md")
    with open(doc_path) as f:
        doc = f.read()
    sample = re.search(r"```\n(model ir_version.*?)```", doc, re.S).group(1)
    without_comments = "\n".join(line.split("  # ")[0] for line in sample.splitlines()) + "\n"
    assert print_model(parse_model(sample, "sample.pir")) == without_comments


def test_equality_ignores_value_names_and_initializer_order():
    renamed = (GOLDEN_MLP.replace("%w", "%weight").replace("%hb", "%t1").replace("%h", "%t0")
               .replace("%x", "%input"))
    lines = renamed.splitlines(keepends=True)
    reordered = "".join(lines[:2] + [lines[3], lines[2]] + lines[4:])  # %b before %weight
    assert structural_diff(small_mlp(), parse_model(reordered)) is None
    swapped_data = reordered.replace("dense<0.1, -0.1>", "dense<0.1, -0.2>")
    assert "initializer" in structural_diff(small_mlp(), parse_model(swapped_data))
