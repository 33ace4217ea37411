# RUN: passctl opt %s -p eliminate-identity --target cpu
# CATCHES: an Identity, an inference Dropout, a Cast to the type the value already has, a Reshape to
#   its own static shape or a Transpose with the identity permutation kept, or one of them removed
#   when it changes something (the Cast to f16 and the real Transpose stay).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3]) -> (f32[3,2], f16[2,3]) {
    %shape = init i64[2] dense<2, 3>
    %i: f32[2,3] = Identity(%x)
    %d: f32[2,3] = Dropout(%i)
    %c: f32[2,3] = Cast(%d) {to = 1}
    %r: f32[2,3] = Reshape(%c, %shape)
    %t0: f32[2,3] = Transpose(%r) {perm = [0, 1]}
    %e: f32[2,3] = Exp(%t0)
    %t: f32[3,2] = Transpose(%e) {perm = [1, 0]}
    %h: f16[2,3] = Cast(%e) {to = 10}
    return %t, %h
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3]) -> (f32[3,2], f16[2,3]) {
#     %shape = init i64[2] dense<2, 3>
#     %e: f32[2,3] = Exp(%x)
#     %t: f32[3,2] = Transpose(%e) {perm = [1, 0]}
#     %h: f16[2,3] = Cast(%e) {to = 10}
#     return %t, %h
#   }
# }
