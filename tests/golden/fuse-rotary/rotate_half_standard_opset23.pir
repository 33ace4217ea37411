# RUN: passctl opt %s -p infer-shapes,fuse-rotary{max_positions=4},dce,lower-standard --target cpu
# CATCHES: transformers' rotate_half rotary on ONNX opset 23 (x * cos + cat(-x2, x1) * sin, cos/sin computed from
#   position_ids and inv_freq) not folded into cos/sin caches of max_positions rows and one
#   ONNX RotaryEmbedding-23 (lower-standard, inputs reordered); a cache holding the duplicated half, or the wrong rows.
model ir_version 8 opset {"": 23} producer "" "" {
  graph @g(%x: f32[1,2,3,4], %position_ids: i64[1,3]) -> (f32[1,2,3,4]) {
    %inv = init f32[2] dense<1.0, 0.01>
    %ax2 = init i64[1] dense<2>
    %ax1 = init i64[1] dense<1>
    %ax3 = init i64[1] dense<3>
    %zero = init i64[1] dense<0>
    %two = init i64[1] dense<2>
    %big = init i64[1] dense<9223372036854775807>
    %pu = Unsqueeze(%position_ids, %ax2)
    %pf = Cast(%pu) {to = 1}
    %f = Mul(%pf, %inv)
    %emb = Concat(%f, %f) {axis = -1}
    %c0 = Cos(%emb)
    %s0 = Sin(%emb)
    %c = Unsqueeze(%c0, %ax1)
    %s = Unsqueeze(%s0, %ax1)
    %xc = Mul(%x, %c)
    %x1 = Slice(%x, %zero, %two, %ax3, %ax1)
    %x2 = Slice(%x, %two, %big, %ax3, %ax1)
    %n = Neg(%x2)
    %rot = Concat(%n, %x1) {axis = -1}
    %rs = Mul(%rot, %s)
    %y: f32[1,2,3,4] = Add(%xc, %rs)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 23} producer "" "" {
#   graph @g(%x: f32[1,2,3,4], %position_ids: i64[1,3]) -> (f32[1,2,3,4]) {
#     %rotary_cos_cache = init f32[4,2] dense<1.0, 1.0, 0.5403023, 0.99995, -0.4161468, 0.9998, -0.9899925, 0.99955004>
#     %rotary_sin_cache = init f32[4,2] dense<0.0, 0.0, 0.84147096, 0.009999833, 0.9092974, 0.019998666, 0.14112, 0.0299955>
#     %y: f32[1,2,3,4] = RotaryEmbedding(%x, %rotary_cos_cache, %rotary_sin_cache, %position_ids) {interleaved = 0}
#     return %y
#   }
# }
