# RUN: passctl opt %s -p infer-shapes,fuse-gelu,dce --target cpu
# CATCHES: the erf GELU formula 0.5 * x * (1 + erf(x / sqrt(2))) not fused into passctl::Gelu, or
#   fused with the tanh approximation.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %sqrt2 = init f32[] dense<1.4142135>
    %one = init f32[] dense<1.0>
    %half = init f32[] dense<0.5>
    %d = Div(%x, %sqrt2)
    %e = Erf(%d)
    %p = Add(%e, %one)
    %m = Mul(%x, %p)
    %y: f32[2,4] = Mul(%m, %half)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %y: f32[2,4] = passctl::Gelu(%x) {approximate = "none"}
#     return %y
#   }
# }
