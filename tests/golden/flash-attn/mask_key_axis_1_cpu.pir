# RUN: passctl opt %s -p flash-attn --target cpu
# CATCHES: an additive mask broadcast over the key axis ([3, 1]) handed to
#   com.microsoft::MultiHeadAttention as attention_bias unexpanded: ONNX Runtime wants it rank 4
#   with the last axis = total sequence length and refuses it at run time (issue 15, case 03).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4], %mask: f32[3,1]) -> (f32[1,2,3,4]) {
    %sqrt_d = init f32[] dense<2.0>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %s = Div(%qk, %sqrt_d)
    %m = Add(%s, %mask)
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
#       %mask: f32[3,1]
#   ) -> (f32[1,2,3,4]) {
#     %attn_axes = init i64[2] dense<0, 1>
#     %attn_11 = init i64[2] dense<1, 1>
#     %attn_bsd = init i64[3] dense<0, 0, 8>
#     %attn_bsd_4 = init i64[3] dense<0, 0, 8>
#     %attn_bsd_9 = init i64[3] dense<0, 0, 8>
#     %attn_bshd = init i64[4] dense<0, 0, 2, -1>
#     %unsqueeze_out = Unsqueeze(%mask, %attn_axes)
#     %shape_out = Shape(%q) {start = 2, end = 3}
#     %shape_out_0 = Shape(%k) {start = 2, end = 3}
#     %concat_out = Concat(%attn_11, %shape_out, %shape_out_0) {axis = 0}
#     %expand_out = Expand(%unsqueeze_out, %concat_out)
#     %transpose_out = Transpose(%k) {perm = [0, 2, 1, 3]}
#     %reshape_out = Reshape(%transpose_out, %attn_bsd)
#     %transpose_out_2 = Transpose(%v) {perm = [0, 2, 1, 3]}
#     %reshape_out_5 = Reshape(%transpose_out_2, %attn_bsd_4)
#     %transpose_out_7 = Transpose(%q) {perm = [0, 2, 1, 3]}
#     %reshape_out_10 = Reshape(%transpose_out_7, %attn_bsd_9)
#     %multiheadattention_out = com.microsoft::MultiHeadAttention(%reshape_out_10, %reshape_out, %reshape_out_5, none, none, %expand_out) {num_heads = 2, scale = 0.5}
#     %reshape_out_12 = Reshape(%multiheadattention_out, %attn_bshd)
#     %y: f32[1,2,3,4] = Transpose(%reshape_out_12) {perm = [0, 2, 1, 3]}
#     return %y
#   }
# }
