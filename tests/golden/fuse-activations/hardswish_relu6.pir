# RUN: passctl opt %s -p infer-shapes,fuse-activations,dce --target cpu
# CATCHES: the torch export form x * Clip(x + 3, 0, 6) / 6 of HardSwish not fused into
#   passctl::HardSwish.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %three = init f32[] dense<3.0>
    %zero = init f32[] dense<0.0>
    %six = init f32[] dense<6.0>
    %a = Add(%x, %three)
    %c = Clip(%a, %zero, %six)
    %m = Mul(%x, %c)
    %y: f32[2,4] = Div(%m, %six)
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
