# RUN: passctl opt %s -p cleanup --target cpu
# CATCHES: the order of the cleanup group (infer-shapes, eliminate-identity, fold-constants, cse,
#   dce) changing what it leaves: the Identity hiding a constant from fold-constants, the two equal
#   expressions merged only after folding, and the dead producers removed at the end.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3]) -> (f32[2,3]) {
    %a = init f32[3] dense<1.0, 2.0, 3.0>
    %two = Constant() {value = f32[] dense<2.0>}
    %ai = Identity(%a)
    %k1 = Mul(%ai, %two)
    %k2 = Mul(%a, %two)
    %u = Add(%x, %k1)
    %v = Add(%x, %k2)
    %dead = Exp(%u)
    %y = Mul(%u, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3]) -> (f32[2,3]) {
#     %k1 = init f32[3] dense<2.0, 4.0, 6.0>
#     %u: f32[2,3] = Add(%x, %k1)
#     %y: f32[2,3] = Mul(%u, %u)
#     return %y
#   }
# }
