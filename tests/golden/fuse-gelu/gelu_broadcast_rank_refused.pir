# RUN: passctl opt %s -p infer-shapes,fuse-gelu,dce --target cpu
# CATCHES: a GELU whose "scalar" 0.5 has shape [1,1,4] (it broadcasts the [2,4] input up to [1,2,4])
#   fused into passctl::Gelu, which returns [2,4] (case 11-fusion-drops-broadcast-rank): the rewriter
#   must refuse a replacement that changes the inferred shape of the value it replaces.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[1,2,4]) {
    %sqrt2 = init f32[] dense<1.4142135>
    %one = init f32[] dense<1.0>
    %half = init f32[1,1,4] dense<0.5, 0.5, 0.5, 0.5>
    %d = Div(%x, %sqrt2)
    %e = Erf(%d)
    %p = Add(%e, %one)
    %m = Mul(%x, %p)
    %y: f32[1,2,4] = Mul(%m, %half)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[1,2,4]) {
#     %sqrt2 = init f32[] dense<1.4142135>
#     %one = init f32[] dense<1.0>
#     %half = init f32[1,1,4] dense<0.5, 0.5, 0.5, 0.5>
#     %d: f32[2,4] = Div(%x, %sqrt2)
#     %e: f32[2,4] = Erf(%d)
#     %p: f32[2,4] = Add(%e, %one)
#     %m: f32[2,4] = Mul(%x, %p)
#     %y: f32[1,2,4] = Mul(%m, %half)
#     return %y
#   }
# }
