# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: Q scaled before the head split (BART's q_proj(x) * scaling, then view + transpose)
#   refused as "scale 1 is not 1/sqrt(head size)": the factor before the Reshape/Transpose is part
#   of the scores' scale (the attention then reads the scaled Q with scale 1).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,3,8], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
    %s = init f32[] dense<0.5>
    %split = init i64[4] dense<1, 3, 2, 4>
    %xs = Mul(%x, %s)
    %q4 = Reshape(%xs, %split)
    %q = Transpose(%q4) {perm = [0, 2, 1, 3]}
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %p = Softmax(%qk) {axis = -1}
    %y: f32[1,2,3,4] = MatMul(%p, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[1,3,8], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %s = init f32[] dense<0.5>
#     %split = init i64[4] dense<1, 3, 2, 4>
#     %xs: f32[1,3,8] = Mul(%x, %s)
#     %q4: f32[1,3,2,4] = Reshape(%xs, %split)
#     %q: f32[1,2,3,4] = Transpose(%q4) {perm = [0, 2, 1, 3]}
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v) {scale = 1.0, mask_kind = "none", is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
