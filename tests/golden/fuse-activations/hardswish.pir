# RUN: passctl opt %s -p infer-shapes,fuse-activations,dce --target cpu
# CATCHES: x * HardSigmoid(x) with alpha 1/6 and beta 0.5 not fused into passctl::HardSwish, or
#   fused with other alpha / beta (a different function).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %h = HardSigmoid(%x) {alpha = 0.16666667, beta = 0.5}
    %y: f32[2,4] = Mul(%x, %h)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %y: f32[2,4] = passctl::HardSwish(%x)
#     return %y
#   }
# }
