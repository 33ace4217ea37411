# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: the variant with the square written as Mul(d, d), the normalization as
#   Mul(d, Reciprocal(Sqrt(...))) and the axes as an input (opset 18) not fused like the Pow / Div
#   form, or the scale-only LayerNorm given a bias.
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %ax = init i64[1] dense<-1>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
    %m = ReduceMean(%x, %ax) {keepdims = 1}
    %d = Sub(%x, %m)
    %p = Mul(%d, %d)
    %v = ReduceMean(%p, %ax) {keepdims = 1}
    %ve = Add(%v, %eps)
    %s = Sqrt(%ve)
    %r = Reciprocal(%s)
    %n = Mul(%d, %r)
    %y: f32[2,4] = Mul(%n, %W)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
#     %y: f32[2,4] = passctl::LayerNorm(%x, %W) {axis = -1, epsilon = 1e-05}
#     return %y
#   }
# }
