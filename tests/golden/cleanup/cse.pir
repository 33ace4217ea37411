# RUN: passctl opt %s -p cse,dce --target cpu
# CATCHES: two nodes with the same op, attributes and inputs not merged (the second's users not
#   rewired to the first), equal initializers not merged, or nodes merged that differ in one
#   attribute (the two Softmax axes) or in input order (Sub is not commutative).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3], %z: f32[2,3]) -> (f32[2,3], f32[2,3], f32[2,3]) {
    %c1 = init f32[3] dense<1.0, 2.0, 3.0>
    %c2 = init f32[3] dense<1.0, 2.0, 3.0>
    %r1 = Relu(%x)
    %r2 = Relu(%x)
    %a1 = Add(%r1, %c1)
    %a2 = Add(%r2, %c2)
    %s: f32[2,3] = Mul(%a1, %a2)
    %p1 = Softmax(%x) {axis = 0}
    %p2 = Softmax(%x) {axis = 1}
    %q: f32[2,3] = Add(%p1, %p2)
    %d1 = Sub(%x, %z)
    %d2 = Sub(%z, %x)
    %d: f32[2,3] = Add(%d1, %d2)
    return %s, %q, %d
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3], %z: f32[2,3]) -> (f32[2,3], f32[2,3], f32[2,3]) {
#     %c1 = init f32[3] dense<1.0, 2.0, 3.0>
#     %r1 = Relu(%x)
#     %a1 = Add(%r1, %c1)
#     %s: f32[2,3] = Mul(%a1, %a1)
#     %p1 = Softmax(%x) {axis = 0}
#     %p2 = Softmax(%x) {axis = 1}
#     %q: f32[2,3] = Add(%p1, %p2)
#     %d1 = Sub(%x, %z)
#     %d2 = Sub(%z, %x)
#     %d: f32[2,3] = Add(%d1, %d2)
#     return %s, %q, %d
#   }
# }
