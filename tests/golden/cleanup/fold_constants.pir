# RUN: passctl opt %s -p fold-constants --target cpu
# CATCHES: a Constant node not lifted to an initializer, an expression of constants (Add, Mul of
#   initializers) not evaluated (or evaluated with other values), Shape of a value with a static
#   shape not folded, or a node with a non-constant input folded.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3]) -> (f32[2,3], i64[2]) {
    %a = init f32[3] dense<1.0, 2.0, 3.0>
    %k = Constant() {value = f32[3] dense<0.5, 0.25, -1.0>}
    %s = Add(%a, %k)
    %t = Mul(%s, %a)
    %y: f32[2,3] = Add(%x, %t)
    %shape: i64[2] = Shape(%x)
    return %y, %shape
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3]) -> (f32[2,3], i64[2]) {
#     %a = init f32[3] dense<1.0, 2.0, 3.0>
#     %k = init f32[3] dense<0.5, 0.25, -1.0>
#     %s = init f32[3] dense<1.5, 2.25, 2.0>
#     %t = init f32[3] dense<1.5, 4.5, 6.0>
#     %shape = init i64[2] dense<2, 3>
#     %y: f32[2,3] = Add(%x, %t)
#     return %y, %shape
#   }
# }
