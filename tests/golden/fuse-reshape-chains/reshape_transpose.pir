# RUN: passctl opt %s -p infer-shapes,fuse-reshape-chains,eliminate-identity,dce --target cpu
# CATCHES: Reshape -> Reshape not collapsed into the last Reshape, Transpose -> Transpose not
#   composed into one permutation (or composed in the wrong order), or a cancelling
#   Unsqueeze / Squeeze pair kept.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3,4]) -> (f32[4,6], f32[4,3,2], f32[2,3,4]) {
    %s1 = init i64[2] dense<6, 4>
    %s2 = init i64[2] dense<4, 6>
    %ax = init i64[1] dense<0>
    %r1 = Reshape(%x, %s1)
    %r2: f32[4,6] = Reshape(%r1, %s2)
    %t1 = Transpose(%x) {perm = [1, 0, 2]}
    %t2: f32[4,3,2] = Transpose(%t1) {perm = [2, 0, 1]}
    %u = Unsqueeze(%x, %ax)
    %sq: f32[2,3,4] = Squeeze(%u, %ax)
    return %r2, %t2, %sq
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3,4]) -> (f32[4,6], f32[4,3,2], f32[2,3,4]) {
#     %collapsed_shape = init i64[2] dense<4, 6>
#     %r2: f32[4,6] = Reshape(%x, %collapsed_shape)
#     %t2: f32[4,3,2] = Transpose(%x) {perm = [2, 1, 0]}
#     %sq: f32[2,3,4] = Identity(%x)
#     return %r2, %t2, %sq
#   }
# }
