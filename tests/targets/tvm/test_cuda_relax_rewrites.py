"""Relax rewrites of TVM CUDA builds (targets/tvm/build.py): ``split`` parts as
``strided_slice`` (``split_as_slices``; the Q/K/V packing that uses it is tested in
test_tvm_gpu_build.py) and GELU formulas as one op (``gelu_from_formula``), each checked against
numpy on the llvm target."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from passctl.ir import from_onnx
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline
from passctl.targets.tvm.build import gelu_from_formula, split_as_slices
from passctl.targets.tvm.frontend import to_relax


def test_split_parts_become_slices_with_the_same_values():
    x = relax.Var("x", relax.TensorType((4, 12), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(x, [3, 8], axis=1))  # widths 3, 5, 4
            a = bb.emit(relax.op.add(relax.TupleGetItem(parts, 0), relax.const(1.0, "float32")))
            b = bb.emit(relax.op.multiply(relax.TupleGetItem(parts, 1), relax.const(2.0, "float32")))
            c = bb.emit(relax.op.negative(relax.TupleGetItem(parts, 2)))
            out = bb.emit_output(relax.Tuple([a, b, c]))
        bb.emit_func_output(out)
    mod = bb.get()
    sliced = split_as_slices(mod)
    text = sliced["main"].script()
    assert "R.split" not in text and text.count("R.strided_slice(") == 3
    data = np.random.default_rng(0).standard_normal((4, 12)).astype(np.float32)
    vm = relax.VirtualMachine(tvm.compile(sliced, target="llvm"), tvm.cpu())
    got = [part.numpy() for part in vm["main"](tvm.runtime.tensor(data))]
    want = [data[:, :3] + 1.0, data[:, 3:8] * 2.0, -data[:, 8:]]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def _gelu_formula_model(form: str, same_x: bool = True, dtype=np.float32):
    """x [2, 8, 24] @ W [24, 32] + b, then GELU written out (as torch's legacy exporter does),
    opset 17 (no Gelu op), every tensor and constant in ``dtype`` (float16 rounds sqrt(2) to
    1.4140625). ``same_x=False``: the formula's halves read different tensors (not a GELU)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((24, 32)) * 0.3).astype(dtype), "w"),
             numpy_helper.from_array(rng.standard_normal(32).astype(dtype), "b")]
    consts = {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5, "three": 3.0,
              "kappa": 0.044715, "beta": math.sqrt(2.0 / math.pi)}
    inits += [numpy_helper.from_array(np.array(v, dtype), k) for k, v in consts.items()]
    tp = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    other = "h" if same_x else "m"
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"])]
    if form == "erf":
        nodes += [helper.make_node("Div", [other, "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["t"])]
    else:
        nodes += [helper.make_node("Pow", [other, "three"], ["c"]),
                  helper.make_node("Mul", ["c", "kappa"], ["ck"]),
                  helper.make_node("Add", [other, "ck"], ["s"]),
                  helper.make_node("Mul", ["s", "beta"], ["i"]), helper.make_node("Tanh", ["i"], ["t"])]
    nodes += [helper.make_node("Add", ["t", "one"], ["p"]), helper.make_node("Mul", ["h", "half"], ["hh"]),
              helper.make_node("Mul", ["hh", "p"], ["y"])]
    graph = helper.make_graph(nodes, "gelu_" + form, [helper.make_tensor_value_info(
        "x", tp, [2, 8, 24])], [helper.make_tensor_value_info("y", tp, [2, 8, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _gelu_reference(h: np.ndarray, form: str) -> np.ndarray:
    """GELU in float64 (Hendrycks & Gimpel 2016), exact or tanh-approximated."""
    h = h.astype(np.float64)
    if form == "erf":
        return 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))
    return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))


@pytest.mark.parametrize("form,dtype", [("erf", np.float32), ("tanh", np.float32),
                                        ("erf", np.float16), ("tanh", np.float16)])
def test_gelu_formula_after_lower_standard_becomes_one_op_and_an_epilogue(form, dtype):
    from passctl.targets.tvm.triton_dispatch import TritonLibrary, dispatch_gemms

    proto = _gelu_formula_model(form, dtype=dtype)
    model = from_onnx(proto)
    PassManager(build_pipeline("cleanup,fuse,lower-tvm", "h200", "tvm")).run(model)
    ops = {n.op_type for n in model.graph.nodes}
    assert "Gelu" not in ops and ("Erf" in ops or "Tanh" in ops)  # lower-standard's formula
    mod, params = to_relax(model, "g")
    mod, count = gelu_from_formula(mod)
    text = mod["main"].script()
    assert count == 1
    assert ("R.nn.gelu(" if form == "erf" else "R.nn.gelu_tanh(") in text
    assert "R.erf(" not in text and "R.tanh(" not in text
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    x = np.random.default_rng(4).standard_normal((2, 8, 24)).astype(dtype)
    got = vm["main"](tvm.runtime.tensor(x), *params).numpy().astype(np.float64)
    arrays = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in proto.graph.initializer}
    want = _gelu_reference(x.astype(np.float64) @ arrays["w"] + arrays["b"], form)
    tol = 1e-5 if dtype == np.float32 else 1e-2  # fp16: a 24-term product rounded to 11 bits
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    # the CUDA build's GEMM dispatch then takes the GELU into its epilogue
    lib = TritonLibrary((9, 0), 132)
    mod, _ = to_relax(model, "g", kernels=lib)
    mod, _ = gelu_from_formula(mod)
    mod, gemms = dispatch_gemms(mod, lib)
    assert gemms == 1 and [e["what"] for e in lib.log] == [
        f"gemm 16x24x32 {np.dtype(dtype).name} +bias " + ("gelu" if form == "erf" else "gelu_tanh")]


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_formula_over_two_tensors_is_not_a_gelu(form):
    mod, _ = to_relax(from_onnx(_gelu_formula_model(form, same_x=False)), "g")
    mod, count = gelu_from_formula(mod)
    assert count == 0 and "R.nn.gelu" not in mod["main"].script()
