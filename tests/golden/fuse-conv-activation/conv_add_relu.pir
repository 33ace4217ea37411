# RUN: passctl opt %s -p fuse-conv-activation,dce --target cpu
# CATCHES: the residual form Relu(Conv(x) + z) not fused into one FusedConv with z as its 4th
#   input (the "sum" input of ONNX Runtime's kernel), or the residual taken from the wrong side of
#   the Add.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,3,3], %z: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
    %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
    %b = init f32[2] dense<0.1, -0.2>
    %c: f32[1,2,3,3] = Conv(%x, %w, %b)
    %s: f32[1,2,3,3] = Add(%c, %z)
    %y: f32[1,2,3,3] = Relu(%s)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(%x: f32[1,2,3,3], %z: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
#     %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
#     %b = init f32[2] dense<0.1, -0.2>
#     %y: f32[1,2,3,3] = com.microsoft::FusedConv(%x, %w, %b, %z) {activation = "Relu"}
#     return %y
#   }
# }
