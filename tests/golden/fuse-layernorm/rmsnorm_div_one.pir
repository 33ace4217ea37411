# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: RMSNorm written as x * Div(1, Sqrt(mean(x^2) + eps)) * w (the TorchScript exporter's
#   torch.rsqrt; case 15-rmsnorm-div-sqrt) left unfused.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %eps = init f32[] dense<1e-06>
    %one = init f32[] dense<1.0>
    %w = init f32[4] dense<0.5, 1.0, 1.5, 2.0>
    %p = Pow(%x, %two)
    %m = ReduceMean(%p) {axes = [-1], keepdims = 1}
    %a = Add(%m, %eps)
    %s = Sqrt(%a)
    %r = Div(%one, %s)
    %n = Mul(%x, %r)
    %y: f32[2,4] = Mul(%w, %n)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %w = init f32[4] dense<0.5, 1.0, 1.5, 2.0>
#     %y: f32[2,4] = passctl::RMSNorm(%x, %w) {axis = -1, epsilon = 1e-06}
#     return %y
#   }
# }
