# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: eager attention Softmax(Q K^T / sqrt(d)) V on [batch, heads, seq, head] tensors not
#   fused into passctl::Attention, its scale (1/sqrt(4) = 0.5) or layout wrong, the K^T transpose
#   kept in front of the fused op, or the divisor accepted as a scale of the wrong sign.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
    %sqrt_d = init f32[] dense<2.0>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %s = Div(%qk, %sqrt_d)
    %p = Softmax(%s) {axis = -1}
    %y: f32[1,2,3,4] = MatMul(%p, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v) {scale = 0.5, mask_kind = "none", is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
