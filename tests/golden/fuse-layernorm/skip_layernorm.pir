# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: the residual Add in front of a decomposed LayerNorm (a SkipLayerNorm) not absorbed into
#   passctl::SkipLayerNormalization, the skip input and x swapped in a way that changes the sum
#   output, or a second LayerNorm fusion left the Add outside.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%a: f32[2,4], %h: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
    %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
    %x = Add(%a, %h)
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
#   graph @g(%a: f32[2,4], %h: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
#     %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
#     %y: f32[2,4] = passctl::SkipLayerNorm(%a, %h, %W, %B) {epsilon = 1e-05}
#     return %y
#   }
# }
