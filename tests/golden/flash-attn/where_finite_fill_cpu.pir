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
#     %attn_zero_0 = init f32[] dense<0.0>
#     %attn_axes_3 = init i64[1] dense<3>
#     %attn_zero_f32 = init f32[] dense<0.0>
#     %attn_bsd = init i64[3] dense<0, 0, 8>
#     %attn_bsd_14 = init i64[3] dense<0, 0, 8>
#     %attn_bsd_19 = init i64[3] dense<0, 0, 8>
#     %attn_bshd = init i64[4] dense<0, 0, 2, -1>
#     %attn_nan = init f32[] dense<nan>
#     %where_out = Where(%keep, %attn_zero, %attn_fill)
#     %unsqueeze_out = Unsqueeze(%where_out, %attn_axes)
#     %mul_out = Mul(%k, %attn_zero_0)
#     %isnan_out = IsNaN(%mul_out)
#     %where_out_1 = Where(%isnan_out, %attn_zero_0, %k)
#     %reducesum_out = ReduceSum(%mul_out, %attn_axes_3) {keepdims = 1}
#     %isnan_out_4 = IsNaN(%reducesum_out)
#     %cast_out = Cast(%isnan_out_4) {to = 1}
#     %transpose_out = Transpose(%cast_out) {perm = [0, 1, 3, 2]}
#     %cast_out_6 = Cast(%keep) {to = 1}
#     %mul_out_8 = Mul(%cast_out_6, %transpose_out)
#     %reducemax_out = ReduceMax(%mul_out_8) {axes = [-1], keepdims = 1}
#     %greater_out = Greater(%reducemax_out, %attn_zero_f32)
#     %transpose_out_10 = Transpose(%where_out_1) {perm = [0, 2, 1, 3]}
#     %reshape_out = Reshape(%transpose_out_10, %attn_bsd)
#     %transpose_out_12 = Transpose(%v) {perm = [0, 2, 1, 3]}
#     %reshape_out_15 = Reshape(%transpose_out_12, %attn_bsd_14)
#     %transpose_out_17 = Transpose(%q) {perm = [0, 2, 1, 3]}
#     %reshape_out_20 = Reshape(%transpose_out_17, %attn_bsd_19)
#     %multiheadattention_out = com.microsoft::MultiHeadAttention(%reshape_out_20, %reshape_out, %reshape_out_15, none, none, %unsqueeze_out) {num_heads = 2, scale = 0.5}
#     %reshape_out_22 = Reshape(%multiheadattention_out, %attn_bshd)
#     %transpose_out_24 = Transpose(%reshape_out_22) {perm = [0, 2, 1, 3]}
#     %cast_out_26 = Cast(%keep) {to = 1}
#     %reducemax_out_28 = ReduceMax(%cast_out_26) {axes = [-1], keepdims = 1}
#     %cast_out_30 = Cast(%reducemax_out_28) {to = 9}
#     %reducemean_out = ReduceMean(%v) {axes = [2], keepdims = 1}
#     %where_out_32 = Where(%cast_out_30, %transpose_out_24, %reducemean_out)
#     %y: f32[1,2,3,4] = Where(%greater_out, %attn_nan, %where_out_32)
#     return %y
#   }
# }
