# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: the exporters' decomposed LayerNorm (ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt,
#   Div, Mul scale, Add bias) not fused into passctl::LayerNormalization, epsilon (1e-5) or axis
#   (-1) lost, the scale or bias not absorbed, or the ops the pattern replaced left behind.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
    %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
    %m = ReduceMean(%x) {axes = [-1], keepdims = 1}
    %d = Sub(%x, %m)
    %p = Pow(%d, %two)
    %v = ReduceMean(%p) {axes = [-1], keepdims = 1}
    %ve = Add(%v, %eps)
    %s = Sqrt(%ve)
    %n = Div(%d, %s)
    %sc = Mul(%n, %W)
    %y: f32[2,4] = Add(%sc, %B)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
#     %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
#     %y: f32[2,4] = passctl::LayerNorm(%x, %W, %B) {axis = -1, epsilon = 1e-05}
#     return %y
#   }
# }
