# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: Where(keep, scores, -10000) (a finite fill) rewritten as an additive mask
#   scores + Where(keep, 0, -10000): in a fully masked query row the original softmax is uniform,
#   the additive one softmax(scores) (issue 15, case 02). The mask must stay boolean, its fill in
#   mask_fill.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4], %keep: bool[1,1,3,3]) -> (f32[1,2,3,4]) {
    %sqrt_d = init f32[] dense<2.0>
    %fill = init f32[] dense<-10000.0>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %s = Div(%qk, %sqrt_d)
    %m = Where(%keep, %s, %fill)
    %p = Softmax(%m) {axis = -1}
    %y: f32[1,2,3,4] = MatMul(%p, %v)
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
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v, %keep) {scale = 0.5, mask_kind = "boolean", mask_fill = -10000.0, is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
