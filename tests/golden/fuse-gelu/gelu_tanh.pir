# RUN: passctl opt %s -p infer-shapes,fuse-gelu,dce --target cpu
# CATCHES: the tanh approximation 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) not
#   fused into passctl::Gelu with approximate = "tanh" (or fused as the exact erf form).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %three = init f32[] dense<3.0>
    %c = init f32[] dense<0.044715>
    %k = init f32[] dense<0.7978846>
    %one = init f32[] dense<1.0>
    %half = init f32[] dense<0.5>
    %x3 = Pow(%x, %three)
    %cx3 = Mul(%c, %x3)
    %in = Add(%x, %cx3)
    %kin = Mul(%k, %in)
    %t = Tanh(%kin)
    %p = Add(%one, %t)
    %hx = Mul(%half, %x)
    %y: f32[2,4] = Mul(%hx, %p)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %y: f32[2,4] = passctl::Gelu(%x) {approximate = "tanh"}
#     return %y
#   }
# }
