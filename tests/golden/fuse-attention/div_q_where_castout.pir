# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: Q divided by sqrt(d) before the product, a boolean keep-mask input through Where(keep,
#   scores, -inf), and the legacy exporter's no-op Cast(Softmax(...), float32) after it
#   (attention-71-div-q-where-castout) not fused, the keep mask not passed as a boolean mask, or
#   the Cast left behind.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4], %keep: bool[1,1,3,3]) -> (f32[1,2,3,4]) {
    %sqrt_d = init f32[] dense<2.0>
    %ninf = init f32[] dense<-inf>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qs = Div(%q, %sqrt_d)
    %qk = MatMul(%qs, %kt)
    %m = Where(%keep, %qk, %ninf)
    %p = Softmax(%m) {axis = -1}
    %pc = Cast(%p) {to = 1}
    %y: f32[1,2,3,4] = MatMul(%pc, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(
#       %q: f32[1,2,3,4],
#       %k: f32[1,2,3,4],
#       %v: f32[1,2,3,4],
#       %keep: bool[1,1,3,3]
#   ) -> (f32[1,2,3,4]) {
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v, %keep) {scale = 0.5, mask_kind = "boolean", is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
