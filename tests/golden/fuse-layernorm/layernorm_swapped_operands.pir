# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: a LayerNorm written with every commutative operand the other way round (Add(eps, var),
#   Mul(Reciprocal(std), d), Mul(W, n), Add(B, y)) at opset 13 (pow-reciprocal, axes as attribute)
#   not fused like the usual order.
model ir_version 8 opset {"": 13} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
    %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
    %m = ReduceMean(%x) {axes = [-1]}
    %d = Sub(%x, %m)
    %p = Pow(%d, %two)
    %v = ReduceMean(%p) {axes = [-1]}
    %ve = Add(%eps, %v)
    %s = Sqrt(%ve)
    %r = Reciprocal(%s)
    %n = Mul(%r, %d)
    %sc = Mul(%W, %n)
    %y: f32[2,4] = Add(%B, %sc)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 13, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
#     %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
#     %y: f32[2,4] = passctl::LayerNorm(%x, %W, %B) {axis = -1, epsilon = 1e-05}
#     return %y
#   }
# }
