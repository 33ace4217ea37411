# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: grouped-query attention (2 KV heads repeated for 4 query heads through transformers'
#   repeat_kv: Unsqueeze, Expand, Reshape) not fused with kv_num_heads = 2, or fused with the
#   repeated K and V (the expansion must go: the kernel repeats the heads itself).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,4,3,2], %k: f32[1,2,3,2], %v: f32[1,2,3,2]) -> (f32[1,4,3,2]) {
    %ax = init i64[1] dense<2>
    %rep = init i64[5] dense<1, 1, 2, 1, 1>
    %heads = init i64[4] dense<0, 4, -1, 2>
    %scale = init f32[] dense<0.70710677>
    %ku = Unsqueeze(%k, %ax)
    %ke = Expand(%ku, %rep)
    %kr = Reshape(%ke, %heads)
    %vu = Unsqueeze(%v, %ax)
    %ve = Expand(%vu, %rep)
    %vr = Reshape(%ve, %heads)
    %kt = Transpose(%kr) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %s = Mul(%qk, %scale)
    %p = Softmax(%s) {axis = -1}
    %y: f32[1,4,3,2] = MatMul(%p, %vr)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%q: f32[1,4,3,2], %k: f32[1,2,3,2], %v: f32[1,2,3,2]) -> (f32[1,4,3,2]) {
#     %y: f32[1,4,3,2] = passctl::Attention(%q, %k, %v) {scale = 0.70710677, mask_kind = "none", is_causal = 0, num_heads = 4, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
