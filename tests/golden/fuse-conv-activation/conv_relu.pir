# RUN: passctl opt %s -p fuse-conv-activation,dce --target cpu
# CATCHES: Conv + bias + Relu not fused into com.microsoft::FusedConv (ONNX Runtime's CPU kernel),
#   the activation attribute wrong or missing, the Conv's attributes (pads, strides) or bias input
#   dropped, the com.microsoft opset import missing, or the Relu left behind.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
    %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
    %b = init f32[2] dense<0.1, -0.2>
    %c: f32[1,2,3,3] = Conv(%x, %w, %b) {pads = [0, 0, 0, 0], strides = [1, 1]}
    %y: f32[1,2,3,3] = Relu(%c)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
#     %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
#     %b = init f32[2] dense<0.1, -0.2>
#     %y: f32[1,2,3,3] = com.microsoft::FusedConv(%x, %w, %b) {activation = "Relu", pads = [0, 0, 0, 0], strides = [1, 1]}
#     return %y
#   }
# }
