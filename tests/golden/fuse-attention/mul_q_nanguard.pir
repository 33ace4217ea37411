# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: the scale on Q before the product (Mul(Q, s)) with transformers 5's NaN guard after the
#   Softmax (Where(IsNaN(p), 0, p): attention-22-mul-q-nomask-nanguard) not fused, or fused without
#   nan_to_zero = 1.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
    %scale = init f32[] dense<0.5>
    %zero = init f32[] dense<0.0>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qs = Mul(%q, %scale)
    %qk = MatMul(%qs, %kt)
    %p = Softmax(%qk) {axis = -1}
    %nan = IsNaN(%p)
    %pz = Where(%nan, %zero, %p)
    %y: f32[1,2,3,4] = MatMul(%pz, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v) {scale = 0.5, mask_kind = "none", is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 1}
#     return %y
#   }
# }
