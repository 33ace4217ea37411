# RUN: passctl opt %s -p fuse-projections,dce --target cpu
# CATCHES: sibling projections of one input not fused into one MatMul + Split (weights
#   concatenated on the output axis, split sizes in the graph's order), or a MatMul fused whose
#   weight is not constant (%w3 is an input) or whose other operand is not the shared input.
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%x: f32[1,3,2], %w3: f32[2,2], %z: f32[1,3,2]) -> (f32[1,3,2], f32[1,3,1], f32[1,3,3], f32[1,3,2], f32[1,3,2]) {
    %wq = init f32[2,2] dense<0.5, -1.0, 2.0, 0.25>
    %wk = init f32[2,1] dense<1.5, -0.75>
    %wv = init f32[2,3] dense<0.125, 1.0, -2.0, 0.5, 0.75, -0.25>
    %q: f32[1,3,2] = MatMul(%x, %wq)
    %k: f32[1,3,1] = MatMul(%x, %wk)
    %v: f32[1,3,3] = MatMul(%x, %wv)
    %n: f32[1,3,2] = MatMul(%x, %w3)
    %o: f32[1,3,2] = MatMul(%z, %wq)
    return %q, %k, %v, %n, %o
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18} producer "" "" {
#   graph @g(
#       %x: f32[1,3,2],
#       %w3: f32[2,2],
#       %z: f32[1,3,2]
#   ) -> (f32[1,3,2], f32[1,3,1], f32[1,3,3], f32[1,3,2], f32[1,3,2]) {
#     %wq = init f32[2,2] dense<0.5, -1.0, 2.0, 0.25>
#     %fused_projection_weight = init f32[2,6] dense<0.5, -1.0, 1.5, 0.125, 1.0, -2.0, 2.0, 0.25, -0.75, 0.5, 0.75, -0.25>
#     %fused_projection_split = init i64[3] dense<2, 1, 3>
#     %fused_projection = MatMul(%x, %fused_projection_weight)
#     %q: f32[1,3,2], %k: f32[1,3,1], %v: f32[1,3,3] = Split(%fused_projection, %fused_projection_split) {axis = -1}
#     %n: f32[1,3,2] = MatMul(%x, %w3)
#     %o: f32[1,3,2] = MatMul(%z, %wq)
#     return %q, %k, %v, %n, %o
#   }
# }
