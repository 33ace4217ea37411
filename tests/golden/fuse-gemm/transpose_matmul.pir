# RUN: passctl opt %s -p fuse-gemm,dce --target cpu
# CATCHES: a Transpose of the last two axes in front of a batched MatMul not folded into
#   com.microsoft::FusedMatMul (transA / transB), or folded into the wrong operand.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%a: f32[2,3,4], %b: f32[2,5,4]) -> (f32[2,3,5]) {
    %bt: f32[2,4,5] = Transpose(%b) {perm = [0, 2, 1]}
    %y: f32[2,3,5] = MatMul(%a, %bt)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(%a: f32[2,3,4], %b: f32[2,5,4]) -> (f32[2,3,5]) {
#     %y: f32[2,3,5] = com.microsoft::FusedMatMul(%a, %b) {transB = 1}
#     return %y
#   }
# }
