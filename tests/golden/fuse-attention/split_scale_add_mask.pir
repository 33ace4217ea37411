# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: torch's sdpa decomposition (the scale split as sqrt(s) on Q and on K^T) with an additive
#   float mask (attention-9-split-add-softmax) not fused, the two factors not multiplied back into
#   one scale (0.5), or the mask dropped or given the boolean kind.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4], %mask: f32[1,1,1,3]) -> (f32[1,2,3,4]) {
    %r = init f32[] dense<0.70710677>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qs = Mul(%q, %r)
    %ks = Mul(%kt, %r)
    %qk = MatMul(%qs, %ks)
    %s = Add(%qk, %mask)
    %p = Softmax(%s) {axis = -1}
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
#       %mask: f32[1,1,1,3]
#   ) -> (f32[1,2,3,4]) {
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v, %mask) {scale = 0.49999997, mask_kind = "additive", is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
