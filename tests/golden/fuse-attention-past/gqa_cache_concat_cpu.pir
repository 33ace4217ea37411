# RUN: passctl opt %s -p infer-shapes,fuse-attention,fuse-attention-past,dce,lower-onnxruntime,dce --target cpu
# CATCHES: the KV-cache Concat(past, new) behind repeat_kv (2 query heads on 1 KV head) not moved
#   into passctl::Attention's past inputs (kv_num_heads must become 1, the presents the op's
#   outputs), or a lowering that drops the past (no mask proves causality here, so the Concat
#   form is expected and the numeric check compares y and both presents).
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%q: f32[1,2,1,8], %k: f32[1,1,1,8], %v: f32[1,1,1,8], %past_key_values.0.key: f32[1,1,2,8], %past_key_values.0.value: f32[1,1,2,8]) -> (f32[1,2,1,8], f32[1,1,3,8], f32[1,1,3,8]) {
    %ax2 = init i64[1] dense<2>
    %rep = init i64[5] dense<1, 1, 2, 3, 8>
    %shp = init i64[4] dense<1, 2, 3, 8>
    %scale = init f32[] dense<0.35355338>
    %pk: f32[1,1,3,8] = Concat(%past_key_values.0.key, %k) {axis = -2}
    %pv: f32[1,1,3,8] = Concat(%past_key_values.0.value, %v) {axis = -2}
    %uk = Unsqueeze(%pk, %ax2)
    %ek = Expand(%uk, %rep)
    %rk = Reshape(%ek, %shp)
    %uv = Unsqueeze(%pv, %ax2)
    %ev = Expand(%uv, %rep)
    %rv = Reshape(%ev, %shp)
    %kt = Transpose(%rk) {perm = [0, 1, 3, 2]}
    %s = MatMul(%q, %kt)
    %ss = Mul(%s, %scale)
    %p = Softmax(%ss) {axis = -1}
    %y: f32[1,2,1,8] = MatMul(%p, %rv)
    return %y, %pk, %pv
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18} producer "" "" {
#   graph @g(
#       %q: f32[1,2,1,8],
#       %k: f32[1,1,1,8],
#       %v: f32[1,1,1,8],
#       %past_key_values.0.key: f32[1,1,2,8],
#       %past_key_values.0.value: f32[1,1,2,8]
#   ) -> (f32[1,2,1,8], f32[1,1,3,8], f32[1,1,3,8]) {
#     %attn_axes = init i64[1] dense<2>
#     %attn_rep = init i64[5] dense<1, 1, 2, 1, 1>
#     %attn_rep_shape = init i64[4] dense<0, 2, -1, 8>
#     %attn_axes_5 = init i64[1] dense<2>
#     %attn_rep_8 = init i64[5] dense<1, 1, 2, 1, 1>
#     %attn_0 = init i64[1] dense<0>
#     %attn_1 = init i64[1] dense<1>
#     %attn_2 = init i64[1] dense<2>
#     %attn_4 = init i64[1] dense<4>
#     %attn_heads = init i64[1] dense<2>
#     %attn_scale = init f32[] dense<0.35355338>
#     %pk: f32[1,1,3,8] = Concat(%past_key_values.0.key, %k) {axis = 2}
#     %pv: f32[1,1,3,8] = Concat(%past_key_values.0.value, %v) {axis = 2}
#     %unsqueeze_out = Unsqueeze(%pk, %attn_axes)
#     %expand_out = Expand(%unsqueeze_out, %attn_rep)
#     %reshape_out = Reshape(%expand_out, %attn_rep_shape)
#     %unsqueeze_out_6 = Unsqueeze(%pv, %attn_axes_5)
#     %expand_out_9 = Expand(%unsqueeze_out_6, %attn_rep_8)
#     %shape_out = Shape(%pv)
#     %slice_out = Slice(%shape_out, %attn_0, %attn_1)
#     %slice_out_11 = Slice(%shape_out, %attn_2, %attn_4)
#     %concat_out_13 = Concat(%slice_out, %attn_heads, %slice_out_11) {axis = 0}
#     %reshape_out_15 = Reshape(%expand_out_9, %concat_out_13)
#     %transpose_out = Transpose(%reshape_out) {perm = [0, 1, 3, 2]}
#     %matmul_out = MatMul(%q, %transpose_out)
#     %mul_out = Mul(%matmul_out, %attn_scale)
#     %softmax_out = Softmax(%mul_out) {axis = -1}
#     %y: f32[1,2,1,8] = MatMul(%softmax_out, %reshape_out_15)
#     return %y, %pk, %pv
#   }
# }
