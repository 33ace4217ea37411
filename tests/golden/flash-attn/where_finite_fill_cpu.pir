# RUN: passctl opt %s -p flash-attn --target cpu
# CATCHES: a finite-fill Where mask (-10000) lowered to MultiHeadAttention without the fix of fully
#   masked rows (the original is uniform there: the mean of V), or an attention_bias of the wrong
#   rank (issue 15, cases 01 and 02).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4], %keep: bool[3,3]) -> (f32[1,2,3,4]) {
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
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(
#       %q: f32[1,2,3,4],
#       %k: f32[1,2,3,4],
#       %v: f32[1,2,3,4],
#       %keep: bool[3,3]
#   ) -> (f32[1,2,3,4]) {
#     %attn_zero = init f32[] dense<0.0>
#     %attn_fill = init f32[] dense<-10000.0>
#     %attn_axes = init i64[2] dense<0, 1>
#     %attn_bsd = init i64[3] dense<0, 0, 8>
#     %attn_bsd_2 = init i64[3] dense<0, 0, 8>
#     %attn_bsd_7 = init i64[3] dense<0, 0, 8>
#     %attn_bshd = init i64[4] dense<0, 0, 2, -1>
#     %where_out = Where(%keep, %attn_zero, %attn_fill)
#     %unsqueeze_out = Unsqueeze(%where_out, %attn_axes)
#     %transpose_out = Transpose(%k) {perm = [0, 2, 1, 3]}
#     %reshape_out = Reshape(%transpose_out, %attn_bsd)
#     %transpose_out_0 = Transpose(%v) {perm = [0, 2, 1, 3]}
#     %reshape_out_3 = Reshape(%transpose_out_0, %attn_bsd_2)
#     %transpose_out_5 = Transpose(%q) {perm = [0, 2, 1, 3]}
#     %reshape_out_8 = Reshape(%transpose_out_5, %attn_bsd_7)
#     %multiheadattention_out = com.microsoft::MultiHeadAttention(%reshape_out_8, %reshape_out, %reshape_out_3, none, none, %unsqueeze_out) {num_heads = 2, scale = 0.5}
#     %reshape_out_10 = Reshape(%multiheadattention_out, %attn_bshd)
#     %transpose_out_12 = Transpose(%reshape_out_10) {perm = [0, 2, 1, 3]}
#     %cast_out = Cast(%keep) {to = 1}
#     %reducemax_out = ReduceMax(%cast_out) {axes = [-1], keepdims = 1}
#     %cast_out_14 = Cast(%reducemax_out) {to = 9}
#     %reducemean_out = ReduceMean(%v) {axes = [2], keepdims = 1}
#     %y: f32[1,2,3,4] = Where(%cast_out_14, %transpose_out_12, %reducemean_out)
#     return %y
#   }
# }
