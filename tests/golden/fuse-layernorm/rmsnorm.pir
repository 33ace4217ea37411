# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: LlamaRMSNorm as the dynamo exporter writes it (x * Reciprocal(Sqrt(mean(x^2) + eps)) *
#   weight) not fused into passctl::RMSNorm, its epsilon or weight lost, or fused as a LayerNorm
#   (which would subtract the mean).
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %ax = init i64[1] dense<-1>
    %eps = init f32[] dense<1e-05>
    %W = init f32[4] dense<1.5, 0.5, 0.75, 1.25>
    %sq = Pow(%x, %two)
    %ms = ReduceMean(%sq, %ax) {keepdims = 1}
    %me = Add(%ms, %eps)
    %sd = Sqrt(%me)
    %r = Reciprocal(%sd)
    %n = Mul(%x, %r)
    %y: f32[2,4] = Mul(%n, %W)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, 0.75, 1.25>
#     %y: f32[2,4] = passctl::RMSNorm(%x, %W) {axis = -1, epsilon = 1e-05}
#     return %y
#   }
# }
