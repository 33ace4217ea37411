# RUN: passctl opt %s -p fuse-gemm-standard,dce --target cpu
# CATCHES: the standard-ONNX variant (for TVM / TensorRT) not turning MatMul + Add into Gemm, or
#   emitting a com.microsoft op where only standard ONNX may appear.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,3]) {
    %w = init f32[4,3] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.6>
    %b = init f32[3] dense<0.1, -0.2, 0.3>
    %m: f32[2,3] = MatMul(%x, %w)
    %y: f32[2,3] = Add(%m, %b)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,3]) {
#     %w = init f32[4,3] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.6>
#     %b = init f32[3] dense<0.1, -0.2, 0.3>
#     %y: f32[2,3] = Gemm(%x, %w, %b)
#     return %y
#   }
# }
