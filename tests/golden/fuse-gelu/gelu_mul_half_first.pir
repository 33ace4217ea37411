# RUN: passctl opt %s -p infer-shapes,fuse-gelu,dce --target cpu
# CATCHES: the erf GELU written as (0.5 * x) * (1 + erf(x * 0.70710677)) (Mul by 1/sqrt(2) instead
#   of Div by sqrt(2), the half on x first: gelu-erf-mul-half-x) not fused into passctl::Gelu.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %r = init f32[] dense<0.70710677>
    %one = init f32[] dense<1.0>
    %half = init f32[] dense<0.5>
    %d = Mul(%x, %r)
    %e = Erf(%d)
    %p = Add(%e, %one)
    %hx = Mul(%half, %x)
    %y: f32[2,4] = Mul(%hx, %p)
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
