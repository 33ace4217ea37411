# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: LlamaRMSNorm as transformers writes it in an fp32 model: hidden_states.to(float32) in
#   and .to(float32) out (no-op Casts), the square as Mul(x, x), the normalization as
#   Div(x, Sqrt(mean + eps)), the weight first. The Cast in front must go (rmsnorm-cast-noop);
#   today the Cast after the norm stays and keeps the weight Mul outside passctl::RMSNorm
#   (rmsnorm-scale does not look through it), as tests/passes/fusion/test_layernorm.py counts.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%h: f32[2,4]) -> (f32[2,4]) {
    %eps = init f32[] dense<1e-06>
    %W = init f32[4] dense<1.5, 0.5, 0.75, 1.25>
    %x = Cast(%h) {to = 1}
    %sq = Mul(%x, %x)
    %ms = ReduceMean(%sq) {axes = [-1], keepdims = 1}
    %me = Add(%ms, %eps)
    %sd = Sqrt(%me)
    %n = Div(%x, %sd)
    %n2 = Cast(%n) {to = 1}
    %y: f32[2,4] = Mul(%W, %n2)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%h: f32[2,4]) -> (f32[2,4]) {
#     %W = init f32[4] dense<1.5, 0.5, 0.75, 1.25>
#     %rmsnorm_out_0: f32[2,4] = passctl::RMSNorm(%h) {axis = -1, epsilon = 1e-06}
#     %n2: f32[2,4] = Cast(%rmsnorm_out_0) {to = 1}
#     %y: f32[2,4] = Mul(%W, %n2)
#     return %y
#   }
# }
