# RUN: passctl opt %s -p infer-shapes,fuse-gelu,dce --target cpu
# CATCHES: the Linear layer's bias Add in front of an erf GELU not absorbed into passctl::Gelu's
#   bias input (BiasGelu), or absorbed when the bias is not a 1-D constant over the last axis.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %bias = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
    %sqrt2 = init f32[] dense<1.4142135>
    %one = init f32[] dense<1.0>
    %half = init f32[] dense<0.5>
    %xb = Add(%x, %bias)
    %d = Div(%xb, %sqrt2)
    %e = Erf(%d)
    %p = Add(%e, %one)
    %m = Mul(%xb, %p)
    %y: f32[2,4] = Mul(%m, %half)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %bias = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
#     %y: f32[2,4] = passctl::Gelu(%x, %bias) {approximate = "none"}
#     return %y
#   }
# }
