# RUN: passctl opt %s -p dce --target cpu
# CATCHES: a node whose outputs nothing reads (and the chain feeding only it) not removed, an unused
#   initializer kept, or a live node removed (the one the output reads through two consumers).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3]) -> (f32[2,3]) {
    %unused = init f32[3] dense<1.0, 2.0, 3.0>
    %dead_w = init f32[3] dense<4.0, 5.0, 6.0>
    %live = Relu(%x)
    %dead1 = Mul(%x, %dead_w)
    %dead2 = Exp(%dead1)
    %y: f32[2,3] = Add(%live, %live)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3]) -> (f32[2,3]) {
#     %live = Relu(%x)
#     %y: f32[2,3] = Add(%live, %live)
#     return %y
#   }
# }
