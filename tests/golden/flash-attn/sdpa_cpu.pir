# RUN: passctl opt %s -p flash-attn --target cpu
# CATCHES: the flash-attn group on the cpu target not ending in ONNX Runtime's kernel: at opset 17
#   passctl::Attention must lower to com.microsoft::MultiHeadAttention on 3-D [batch, seq, hidden]
#   projections (heads merged by Transpose + Reshape around it), with num_heads and scale set.
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
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %attn_bsd = init i64[3] dense<0, 0, 8>
#     %attn_bsd_2 = init i64[3] dense<0, 0, 8>
#     %attn_bsd_7 = init i64[3] dense<0, 0, 8>
#     %attn_bshd = init i64[4] dense<0, 0, 2, -1>
#     %transpose_out = Transpose(%k) {perm = [0, 2, 1, 3]}
#     %reshape_out = Reshape(%transpose_out, %attn_bsd)
#     %transpose_out_0 = Transpose(%v) {perm = [0, 2, 1, 3]}
#     %reshape_out_3 = Reshape(%transpose_out_0, %attn_bsd_2)
#     %transpose_out_5 = Transpose(%q) {perm = [0, 2, 1, 3]}
#     %reshape_out_8 = Reshape(%transpose_out_5, %attn_bsd_7)
#     %multiheadattention_out = com.microsoft::MultiHeadAttention(%reshape_out_8, %reshape_out, %reshape_out_3) {num_heads = 2, scale = 0.5}
#     %reshape_out_10 = Reshape(%multiheadattention_out, %attn_bshd)
#     %y: f32[1,2,3,4] = Transpose(%reshape_out_10) {perm = [0, 2, 1, 3]}
#     return %y
#   }
# }
