"""amp golden tests in the IR text form: where the Casts go, which weights change type (Before/Expected)."""

from __future__ import annotations

from passctl.ir import assert_structurally_equal, parse_model
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline


def _amp(text: str, pipeline: str, target: str):
    model = parse_model(text, "before.pir")
    PassManager(build_pipeline(pipeline, target), verify_each=True).run(model)
    return model


# The typed graph for a GPU target: one Cast in, the shared weight converted once, the Transpose follows
# its fp16 producer, the Exp stays float32 by rule (a Cast before and after it), and the Cast that
# feeds it also serves as the graph output %b (no second Cast of the same value).
BEFORE = """
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,2]) -> (f32[2,2], f32[2,2]) {
    %w = init f32[2,2] dense<0.5, -1.0, 0.25, 2.0>
    %a: f32[2,2] = MatMul(%x, %w)
    %t: f32[2,2] = Transpose(%a) {perm = [1, 0]}
    %b: f32[2,2] = MatMul(%t, %w)
    %e: f32[2,2] = Exp(%b)
    %y: f32[2,2] = Mul(%e, %a)
    return %y, %b
  }
}
"""

EXPECTED_A100 = """
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,2]) -> (f32[2,2], f32[2,2]) {
    %w = init f16[2,2] dense<0.5, -1.0, 0.25, 2.0>
    %xh: f16[2,2] = Cast(%x) {to = 10}
    %a: f16[2,2] = MatMul(%xh, %w)
    %t: f16[2,2] = Transpose(%a) {perm = [1, 0]}
    %bh: f16[2,2] = MatMul(%t, %w)
    %b: f32[2,2] = Cast(%bh) {to = 1}
    %e: f32[2,2] = Exp(%b)
    %eh: f16[2,2] = Cast(%e) {to = 10}
    %yh: f16[2,2] = Mul(%eh, %a)
    %y: f32[2,2] = Cast(%yh) {to = 1}
    return %y, %b
  }
}
"""


def test_typed_graph_for_a100():
    got = _amp(BEFORE, "amp{dtype=fp16,measure=false}", "a100")
    assert_structurally_equal(got, parse_model(EXPECTED_A100, "expected.pir"), node_names=False)


# The cpu target in bf16 (emulated): each rounding node computes in float32 between a Cast up and a
# Cast down to bf16, the Transpose runs natively in bf16 (ONNX Runtime's CPU EP has that kernel), the
# weight is stored in bf16 and cast up at run time, and every value has one Cast per type.
EXPECTED_CPU_BF16 = """
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,2]) -> (f32[2,2], f32[2,2]) {
    %w = init bf16[2,2] dense<0.5, -1.0, 0.25, 2.0>
    %w32: f32[2,2] = Cast(%w) {to = 1}
    %xl: bf16[2,2] = Cast(%x) {to = 16}
    %x32: f32[2,2] = Cast(%xl) {to = 1}
    %a32: f32[2,2] = MatMul(%x32, %w32)
    %a: bf16[2,2] = Cast(%a32) {to = 16}
    %a_up: f32[2,2] = Cast(%a) {to = 1}
    %t: bf16[2,2] = Transpose(%a) {perm = [1, 0]}
    %t32: f32[2,2] = Cast(%t) {to = 1}
    %b32: f32[2,2] = MatMul(%t32, %w32)
    %bl: bf16[2,2] = Cast(%b32) {to = 16}
    %b: f32[2,2] = Cast(%bl) {to = 1}
    %e: f32[2,2] = Exp(%b)
    %el: bf16[2,2] = Cast(%e) {to = 16}
    %e32: f32[2,2] = Cast(%el) {to = 1}
    %y32: f32[2,2] = Mul(%e32, %a_up)
    %yl: bf16[2,2] = Cast(%y32) {to = 16}
    %y: f32[2,2] = Cast(%yl) {to = 1}
    return %y, %b
  }
}
"""


def test_emulated_graph_for_cpu_bf16():
    got = _amp(BEFORE, "amp{dtype=bf16,measure=false}", "cpu")
    assert_structurally_equal(got, parse_model(EXPECTED_CPU_BF16, "expected.pir"), node_names=False)
