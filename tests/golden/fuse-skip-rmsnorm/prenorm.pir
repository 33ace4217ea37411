# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,fuse-skip-rmsnorm,dce --target cpu
# CATCHES: the residual Add before an RMSNorm (pre-norm decoder block) not fused into
#   passctl::SkipRMSNorm, or the sum, which also feeds the next residual Add, not taken from the
#   fused op's second output (a recomputed or dangling sum).
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%a: f32[2,4], %h: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %ax = init i64[1] dense<-1>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, 0.75, 1.25>
    %s = Add(%a, %h)
    %sq = Pow(%s, %two)
    %ms = ReduceMean(%sq, %ax) {keepdims = 1}
    %me = Add(%ms, %eps)
    %sd = Sqrt(%me)
    %r = Reciprocal(%sd)
    %n = Mul(%s, %r)
    %y = Mul(%n, %W)
    %z: f32[2,4] = Add(%s, %y)
    return %z
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18, "passctl": 1} producer "" "" {
#   graph @g(%a: f32[2,4], %h: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, 0.75, 1.25>
#     %rmsnorm_out_0_skip: f32[2,4], %s_sum: f32[2,4] = passctl::SkipRMSNorm(%a, %h, %W) {epsilon = 1e-05}
#     %z: f32[2,4] = Add(%s_sum, %rmsnorm_out_0_skip)
#     return %z
#   }
# }
