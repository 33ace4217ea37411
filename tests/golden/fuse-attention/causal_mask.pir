# RUN: passctl opt %s -p infer-shapes,fold-constants,fuse-attention,dce --target cpu
# CATCHES: a causal mask (Where(Trilu lower triangle of ones, scores, -inf)) not recognised as
#   is_causal on passctl::Attention, or the upper triangle taken for the lower one.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
    %scale = init f32[] dense<0.5>
    %ones = init bool[3,3] dense<true, true, true, true, true, true, true, true, true>
    %ninf = init f32[] dense<-inf>
    %keep = Trilu(%ones) {upper = 0}
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %s = Mul(%qk, %scale)
    %m = Where(%keep, %s, %ninf)
    %p = Softmax(%m) {axis = -1}
    %y: f32[1,2,3,4] = MatMul(%p, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %keep = init bool[3,3] dense<true, false, false, true, true, false, true, true, true>
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v, %keep) {scale = 0.5, mask_kind = "boolean", is_causal = 1, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
