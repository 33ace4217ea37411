# RUN: passctl opt %s -p amp{dtype=fp16,measure=false} --target a100
# CATCHES: where amp puts the Casts on a GPU target (rules only, no measurement: deterministic):
#   one Cast in, the shared MatMul weight converted to fp16 once, the Transpose following its fp16
#   producer, Exp kept in float32 by rule (a Cast before and after it), the Cast that feeds it
#   also serving as graph output %b (no second Cast of one value), and fp32 graph inputs/outputs.
# NUMERIC: rtol=2e-3 (fp16 rounding: about 2^-11 relative per op; ONNX Runtime's CPU provider
#   runs this fp16 graph in float32, outputs equal to the input's, so a GPU would see more)
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
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,2]) -> (f32[2,2], f32[2,2]) {
#     %w_f16 = init f16[2,2] dense<0.5, -1.0, 0.25, 2.0>
#     %x_f16: f16[2,2] = Cast(%x) {to = 10}
#     %a: f16[2,2] = MatMul(%x_f16, %w_f16)
#     %t: f16[2,2] = Transpose(%a) {perm = [1, 0]}
#     %b_f16: f16[2,2] = MatMul(%t, %w_f16)
#     %b: f32[2,2] = Cast(%b_f16) {to = 1}
#     %e: f32[2,2] = Exp(%b)
#     %e_f16: f16[2,2] = Cast(%e) {to = 10}
#     %y_f16: f16[2,2] = Mul(%e_f16, %a)
#     %y: f32[2,2] = Cast(%y_f16) {to = 1}
#     return %y, %b
#   }
# }
