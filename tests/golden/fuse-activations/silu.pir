# RUN: passctl opt %s -p infer-shapes,fuse-activations,dce --target cpu
# CATCHES: x * Sigmoid(x) (SiLU / Swish) not fused into passctl::SiLU, or fused when the Mul's
#   other operand is not the Sigmoid's own input.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %s = Sigmoid(%x)
    %y: f32[2,4] = Mul(%x, %s)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %y: f32[2,4] = passctl::SiLU(%x)
#     return %y
#   }
# }
