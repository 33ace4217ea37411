# RUN: passctl opt %s -p cleanup --target cpu
# CATCHES: a stale declared shape (r declared [3,2], Relu of a [2,3] input computes [2,3]) kept by
#   infer-shapes, so that eliminate-identity drops Reshape(r, [3,2]) as a no-op and y comes out
#   [2,3] (case 09-stale-value-info-reshape-removed).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3]) -> (f32[3,2]) {
    %s = init i64[2] dense<3, 2>
    %r: f32[3,2] = Relu(%x)
    %y: f32[3,2] = Reshape(%r, %s)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3]) -> (f32[3,2]) {
#     %s = init i64[2] dense<3, 2>
#     %r: f32[2,3] = Relu(%x)
#     %y: f32[3,2] = Reshape(%r, %s)
#     return %y
#   }
# }
