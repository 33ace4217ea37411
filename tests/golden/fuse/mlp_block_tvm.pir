# RUN: passctl opt %s -p fuse --target cpu --emit tvm
# CATCHES: the fuse group as expanded for the TVM emitter: the same fusions, then lower-standard
#   (standard ONNX only: LayerNormalization at opset 17, the erf GELU decomposed again since ONNX
#   Gelu needs opset 20, no com.microsoft op) and fuse-gemm-standard leaving the MatMul alone
#   because its bias went to the GELU.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
    %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
    %w = init f32[4,4] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.625, 0.375, 1.25, -0.75, 0.5>
    %b = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
    %sqrt2 = init f32[] dense<1.4142135>
    %one = init f32[] dense<1.0>
    %half = init f32[] dense<0.5>
    %m = ReduceMean(%x) {axes = [-1], keepdims = 1}
    %d = Sub(%x, %m)
    %p = Pow(%d, %two)
    %v = ReduceMean(%p) {axes = [-1], keepdims = 1}
    %ve = Add(%v, %eps)
    %s = Sqrt(%ve)
    %n = Div(%d, %s)
    %sc = Mul(%n, %W)
    %ln = Add(%sc, %B)
    %mm = MatMul(%ln, %w)
    %h = Add(%mm, %b)
    %hd = Div(%h, %sqrt2)
    %e = Erf(%hd)
    %ep = Add(%e, %one)
    %g = Mul(%h, %ep)
    %y: f32[2,4] = Mul(%g, %half)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
#     %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
#     %w = init f32[4,4] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.625, 0.375, 1.25, -0.75, 0.5>
#     %b = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
#     %sqrt2_7 = init f32[1] dense<1.4142135>
#     %one_8 = init f32[1] dense<1.0>
#     %half_11 = init f32[1] dense<0.5>
#     %layernormalization_out: f32[2,4] = LayerNormalization(%x, %W, %B) {axis = -1, epsilon = 1e-05}
#     %mm: f32[2,4] = MatMul(%layernormalization_out, %w)
#     %add_out: f32[2,4] = Add(%mm, %b)
#     %div_out = Div(%add_out, %sqrt2_7)
#     %erf_out = Erf(%div_out)
#     %add_out_9 = Add(%erf_out, %one_8)
#     %mul_out = Mul(%add_out, %half_11)
#     %y: f32[2,4] = Mul(%mul_out, %add_out_9)
#     return %y
#   }
# }
