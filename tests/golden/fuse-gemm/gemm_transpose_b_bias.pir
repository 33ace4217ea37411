# RUN: passctl opt %s -p fuse-gemm,dce --target cpu
# CATCHES: a Transpose in front of Gemm's B operand (gemm-transpose-b-bias) not folded into
#   transB = 1 with the bias C and alpha kept, or folded into transA.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4], %w: f32[3,4]) -> (f32[2,3]) {
    %b = init f32[3] dense<0.1, -0.2, 0.3>
    %wt = Transpose(%w) {perm = [1, 0]}
    %y: f32[2,3] = Gemm(%x, %wt, %b) {alpha = 0.5}
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,4], %w: f32[3,4]) -> (f32[2,3]) {
#     %b = init f32[3] dense<0.1, -0.2, 0.3>
#     %y: f32[2,3] = Gemm(%x, %w, %b) {alpha = 0.5, transB = 1}
#     return %y
#   }
# }
