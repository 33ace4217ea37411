# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: a standard ONNX LayerNormalization (opset 17) not adopted as passctl::LayerNorm (so
#   SkipLayerNorm fusion and the lowerings see one form), its epsilon lost, or the Add of the
#   residual in front of it not turned into passctl::SkipLayerNorm.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%a: f32[2,4], %h: f32[2,4]) -> (f32[2,4]) {
    %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
    %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
    %x = Add(%a, %h)
    %y: f32[2,4] = LayerNormalization(%x, %W, %B) {axis = -1, epsilon = 0.001}
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%a: f32[2,4], %h: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, -1.0, 2.0>
#     %B = init f32[4] dense<0.1, -0.2, 0.3, 0.0>
#     %y: f32[2,4] = passctl::SkipLayerNorm(%a, %h, %W, %B) {epsilon = 0.001}
#     return %y
#   }
# }
