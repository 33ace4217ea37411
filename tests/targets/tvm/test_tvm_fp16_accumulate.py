"""fp16 matmuls left to TVM's kernels sum in float32 (``accumulate_in_fp32``), like ONNX Runtime."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from tvm_helpers import emit_tvm, rel_err, run_tvm

from passctl.ir import from_onnx


def test_fp16_matmul_on_cpu_accumulates_in_float32(tmp_path):
    """A [64, 768] x [768, 256] fp16 MatMul on the llvm target against numpy in float64: with
    TVM 0.27's fp16 accumulator the error was 8.9e-3 of the max (fresh-user trial, K = 768);
    summed in float32 and rounded once it is the fp16 rounding of the output (< 2e-3)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 768)).astype(np.float16)
    w = (rng.standard_normal((768, 256)) / np.sqrt(768)).astype(np.float16)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [64, 768])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [64, 256])],
                              [numpy_helper.from_array(w, "w")])
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    info = emit_tvm(model, tmp_path / "a")
    assert info["self_check"]["ok"] is True  # fp16 outputs are checked (1e-2), not skipped
    got = run_tvm(tmp_path / "a", {"x": x})["y"]
    assert got.dtype == np.float16
    want = x.astype(np.float64) @ w.astype(np.float64)
    assert rel_err(got, want) < 2e-3
